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

Mutex& PrimitiveCreationMutex() {
  static auto* mu = new Mutex();
  return *mu;
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

dnnl_primitive_desc_t ImplementationNotNamed(const_dnnl_op_desc_t op_desc,
                                             const dnnl::primitive_attr& attr,
                                             const dnnl::primitive_desc& hint,
                                             const std::string& avoid) {
  dnnl_primitive_desc_iterator_t it = nullptr;
  if (dnnl_primitive_desc_iterator_create(&it, op_desc, attr.get(), CpuEngine().get(),
                                          hint.get()) != dnnl_success) {
    return nullptr;
  }
  // The iterator starts at the first implementation.
  dnnl_primitive_desc_t found = nullptr;
  do {
    dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
    const char* name = nullptr;
    if (pd != nullptr &&
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success &&
        name != nullptr && std::string(name).rfind(avoid, 0) != 0) {
      found = pd;
      break;
    }
    if (pd != nullptr) dnnl_primitive_desc_destroy(pd);
  } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
  dnnl_primitive_desc_iterator_destroy(it);
  return found;
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
