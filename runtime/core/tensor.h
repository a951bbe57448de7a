// A tensor view: a pointer, an element type and a shape. It owns nothing; memory
// comes from an Allocator (see allocator.h) through a Buffer. Copying a Tensor
// copies the view. Not synchronised.
#ifndef TANDEM_RUNTIME_CORE_TENSOR_H_
#define TANDEM_RUNTIME_CORE_TENSOR_H_

#include <cstdint>

#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"

namespace tandem {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;

  Tensor() = default;
  Tensor(void* d, DType t, Shape s) : data(d), dtype(t), shape(std::move(s)) {}
  static Tensor F32(float* d, Shape s) { return Tensor(d, DType::kF32, std::move(s)); }
  static Tensor I32(int32_t* d, Shape s) { return Tensor(d, DType::kI32, std::move(s)); }

  int64_t elements() const { return shape.elements(); }
  int64_t bytes() const { return elements() * DTypeBytes(dtype); }
  // Leading dimension: the batch, for activations.
  int64_t batch() const { return shape.rank() > 0 ? shape.dim(0) : 1; }

  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_TENSOR_H_
