// Carves consecutive 64-byte-aligned float sub-buffers out of one allocation (a
// layer's `saved` or workspace region). Forward and Backward carve in the same
// order so both see the same layout.
#ifndef TANDEM_RUNTIME_LAYERS_CARVER_H_
#define TANDEM_RUNTIME_LAYERS_CARVER_H_

#include <cstdint>

#include "runtime/cpu/kernels.h"

namespace tandem {

class Carver {
 public:
  explicit Carver(const void* base) : p_(const_cast<char*>(static_cast<const char*>(base))) {}
  float* Take(int64_t floats) { return static_cast<float*>(TakeBytes(floats * 4)); }
  void* TakeBytes(int64_t bytes) {
    void* out = p_;
    p_ += cpu::AlignWorkspace(bytes);
    return out;
  }
  // Bytes a sequence of Take calls of these sizes uses.
  static int64_t Floats(int64_t floats) { return cpu::AlignWorkspace(floats * 4); }

 private:
  char* p_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_CARVER_H_
