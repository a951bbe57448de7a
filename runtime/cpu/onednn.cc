#include "runtime/cpu/onednn.h"

#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"

namespace tandem::cpu {

const dnnl::engine& CpuEngine() {
  static const auto* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

std::string OneDnnIsa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

std::string OneDnnVersion() {
  const dnnl_version_t* v = dnnl_version();
  return absl::StrCat(v->major, ".", v->minor, ".", v->patch);
}

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

namespace {

// A thread's scratchpad: 64-byte aligned, grown as needed, kept for the thread.
class ThreadScratch {
 public:
  ~ThreadScratch() { std::free(data_); }
  void* Get(size_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      size_ = (bytes + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, size_);
      if (data_ == nullptr) {
        size_ = 0;
        throw std::bad_alloc();
      }
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

void Execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args) {
  dnnl::stream& stream = ThreadStream();
  // The C query borrows the primitive's descriptor (the C++ wrapper would take
  // ownership of it).
  const dnnl_memory_desc_t* scratch_md =
      dnnl_primitive_desc_query_md(prim.get_primitive_desc(), dnnl_query_scratchpad_md, 0);
  const size_t bytes = scratch_md == nullptr ? 0 : dnnl_memory_desc_get_size(scratch_md);
  if (bytes == 0) {
    prim.execute(stream, args);
  } else {
    // One primitive runs at a time per thread, and the stream is waited on
    // before returning, so the thread's scratch is free again afterwards.
    thread_local ThreadScratch scratch;
    std::unordered_map<int, dnnl::memory> with_scratch = args;
    with_scratch.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(dnnl::memory::desc(*scratch_md),
                                                           CpuEngine(), scratch.Get(bytes)));
    prim.execute(stream, with_scratch);
  }
  stream.wait();
}

}  // namespace tandem::cpu
