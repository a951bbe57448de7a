#include "runtime/cpu/onednn.h"

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

std::string OneDnnVersion() {
  const dnnl_version_t* v = dnnl_version();
  return absl::StrCat(v->major, ".", v->minor, ".", v->patch);
}

void Execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args) {
  dnnl::stream& stream = ThreadStream();
  prim.execute(stream, args);
  stream.wait();
}

}  // namespace tandem::cpu
