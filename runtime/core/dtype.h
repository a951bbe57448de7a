// Element types of tensors. Tensors between layers are fp32; bf16 and fp16 are
// the 16-bit types matrix products may take (mixed precision) and bf16 working
// copies of weights and gradients; the type travels with every tensor.
#ifndef TANDEM_RUNTIME_CORE_DTYPE_H_
#define TANDEM_RUNTIME_CORE_DTYPE_H_

#include <cstdint>

namespace tandem {

enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  // Token ids and class labels.
  kI32 = 2,
  // IEEE binary16: the operands of fp16 products (PRECISION_FP16).
  kF16 = 3,
};

// The 16-bit floating-point types: a layer whose compute_dtype() is one of them
// rounds its matrix products' operands to it and accumulates in fp32.
constexpr bool IsHalf(DType t) { return t == DType::kBF16 || t == DType::kF16; }

constexpr int64_t DTypeBytes(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 0;
}

constexpr const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kF16:
      return "f16";
  }
  return "?";
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_DTYPE_H_
