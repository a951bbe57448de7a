// Carves consecutive 64-byte-aligned float sub-buffers out of one allocation (a
// layer's `saved` or workspace region). Forward and Backward carve in the same
// order so both see the same layout. Carving from a null base hands out null
// pointers and only counts: `used()` is then the region's size.
#ifndef TANDEM_RUNTIME_LAYERS_CARVER_H_
#define TANDEM_RUNTIME_LAYERS_CARVER_H_

#include <cstdint>

#include "runtime/cpu/kernels.h"

namespace tandem {

class Carver {
 public:
  explicit Carver(const void* base) : base_(const_cast<char*>(static_cast<const char*>(base))) {}
  float* Take(int64_t floats) { return static_cast<float*>(TakeBytes(floats * 4)); }
  void* TakeBytes(int64_t bytes) {
    void* out = base_ != nullptr ? base_ + used_ : nullptr;
    used_ += cpu::AlignWorkspace(bytes);
    return out;
  }
  // Bytes handed out so far, alignment included.
  int64_t used() const { return used_; }
  // Bytes a sequence of Take calls of these sizes uses.
  static int64_t Floats(int64_t floats) { return cpu::AlignWorkspace(floats * 4); }

 private:
  char* base_;
  int64_t used_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_CARVER_H_
