// Tensor shapes: a short list of dimension sizes, outermost first. Activations
// carry the batch as dimension 0; per-sample shapes (layer configuration) do not.
// Image activations are NHWC (channels last), the layout oneDNN's fp32 kernels
// run natively. Value type; not synchronised.
#ifndef TANDEM_RUNTIME_CORE_SHAPE_H_
#define TANDEM_RUNTIME_CORE_SHAPE_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_[i < 0 ? i + rank() : i]; }
  int64_t operator[](int i) const { return dim(i); }
  const std::vector<int64_t>& dims() const { return dims_; }

  // Product of the dimensions; 1 for a scalar (rank 0).
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }

  // Product of the dimensions when none is negative and the
  // product, computed without overflow, is at most `limit`; nullopt otherwise.
  std::optional<int64_t> CheckedElements(int64_t limit) const {
    int64_t n = 1;
    for (int64_t d : dims_) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > limit) return std::nullopt;
    }
    return n;
  }

  // This per-sample shape with a leading batch dimension.
  Shape WithBatch(int64_t batch) const {
    std::vector<int64_t> d;
    d.reserve(dims_.size() + 1);
    d.push_back(batch);
    d.insert(d.end(), dims_.begin(), dims_.end());
    return Shape(std::move(d));
  }

  // Drops dimension 0 (the batch).
  Shape WithoutBatch() const {
    return Shape(std::vector<int64_t>(dims_.begin() + (dims_.empty() ? 0 : 1), dims_.end()));
  }

  // "[128, 28, 28, 1]".
  std::string ToString() const {
    std::string s = "[";
    for (size_t i = 0; i < dims_.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(dims_[i]);
    }
    return s + "]";
  }

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::vector<int64_t> dims_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_SHAPE_H_
