// The process's oneDNN CPU engine and per-thread streams, plus small helpers.
// oneDNN here runs on OpenMP; a stream is used only by the thread that owns it.
// Thread-safe.
#ifndef TANDEM_RUNTIME_CPU_ONEDNN_H_
#define TANDEM_RUNTIME_CPU_ONEDNN_H_

#include <string>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "runtime/core/mutex.h"

namespace tandem::cpu {

const dnnl::engine& CpuEngine();
// The calling thread's stream on CpuEngine().
dnnl::stream& ThreadStream();

// Held while a primitive descriptor and its primitive are created. oneDNN
// 2.6's process-wide primitive cache is not safe when threads create
// primitives at the same time (ThreadSanitizer reports races inside it, on its
// lock's lazy set-up and on cache keys that point into another thread's
// primitive descriptor; runtime/cpu/primitive_creation_stress_test). Creation
// happens once per layer and batch size, or matrix shape (PrimitiveCache),
// so serialising it costs a first step a few milliseconds at most; running
// primitives needs no lock.
Mutex& PrimitiveCreationMutex();

// "2.6.3".
std::string OneDnnVersion();
// The instruction set oneDNN's kernels use on this CPU ("avx512_core_bf16",
// "avx2", ...), as benchmarks report beside their figures.
std::string OneDnnIsa();

// oneDNN dims from int64 values.
inline dnnl::memory::dims Dims(std::initializer_list<int64_t> d) {
  return dnnl::memory::dims(d.begin(), d.end());
}

// An f32 memory descriptor with explicit strides (elements).
inline dnnl::memory::desc StridedF32(const dnnl::memory::dims& dims,
                                     const dnnl::memory::dims& strides) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

// A dense f32 descriptor in the given plain layout.
inline dnnl::memory::desc PlainF32(const dnnl::memory::dims& dims, dnnl::memory::format_tag tag) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag);
}

// Wraps caller memory (no copy).
inline dnnl::memory Wrap(const dnnl::memory::desc& md, const void* ptr) {
  return dnnl::memory(md, CpuEngine(), const_cast<void*>(ptr));
}

// Attributes every primitive is created with: a user-managed scratchpad.
// oneDNN's library-managed one is shared by all primitives of the thread that
// created them (Debian builds oneDNN without DNNL_ENABLE_CONCURRENT_EXEC), so
// a primitive run on another thread than its creator's, while that thread runs
// another, would share its scratch memory. Primitives here are cached per layer
// and run from whichever worker computes the layer (the plan executor's
// accelerator and host streams at once, in hetero_dp), so Execute passes each
// call the calling thread's own scratchpad instead.
dnnl::primitive_attr UserScratchpad();

// The first of oneDNN's implementations of `op_desc` (with `attr` and the
// forward `hint`, in oneDNN's order of preference) whose name does not start
// with `avoid`, as a C primitive descriptor the caller owns (a C++ primitive
// descriptor takes it); null when there is none. For steering around an
// implementation with a known defect.
dnnl_primitive_desc_t ImplementationNotNamed(const_dnnl_op_desc_t op_desc,
                                             const dnnl::primitive_attr& attr,
                                             const dnnl::primitive_desc& hint,
                                             const std::string& avoid);

// Runs `prim` on the calling thread's stream, with the calling thread's
// scratchpad, and waits. `prim` must have been created with UserScratchpad().
void Execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args);

}  // namespace tandem::cpu

#endif  // TANDEM_RUNTIME_CPU_ONEDNN_H_
