// Element types of tensors. fp32 is the only compute type today; the type travels
// with every tensor so bf16 can follow without changing interfaces.
#ifndef TANDEM_RUNTIME_CORE_DTYPE_H_
#define TANDEM_RUNTIME_CORE_DTYPE_H_

#include <cstdint>

namespace tandem {

enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  // Token ids and class labels.
  kI32 = 2,
};

constexpr int64_t DTypeBytes(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
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
  }
  return "?";
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_DTYPE_H_
