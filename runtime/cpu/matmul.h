// Matrix products on the CPU through oneDNN's matmul primitive (brgemm kernels
// on AVX-512), with primitives cached by shape.
//
//   C[b] = alpha * op(A[b]) * op(B[b]) (+ bias) (+ C[b] if accumulate)
//
// for b < batch, op(X) = X or X^T, A is m x k after op, B is k x n, C is m x n,
// all row-major with leading dimensions (row strides) and batch strides in
// elements. Every GEMM of the CPU layers goes through here. Thread-safe.
#ifndef TANDEM_RUNTIME_CPU_MATMUL_H_
#define TANDEM_RUNTIME_CPU_MATMUL_H_

#include <cstdint>
#include <string>

namespace tandem::cpu {

struct MatmulShape {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;
  bool trans_b = false;
  // Row strides; 0 = dense (k or m for A, n or k for B, n for C).
  int64_t lda = 0, ldb = 0, ldc = 0;
  // Batch strides; 0 = dense.
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0;
  bool bias = false;
  bool accumulate = false;
  float alpha = 1.0f;
};

void Matmul(const MatmulShape& shape, const float* a, const float* b, float* c,
            const float* bias = nullptr);

// The same product from bfloat16 A and B (bit patterns, runtime/core/bf16.h),
// accumulated and written in f32 (C and the bias are f32): mixed precision's
// matrix products. oneDNN runs them on AMX or AVX512-BF16 where the CPU has
// them, and emulates them (slowly) elsewhere; OneDnnIsa() says which.
void MatmulBf16(const MatmulShape& shape, const uint16_t* a, const uint16_t* b, float* c,
                const float* bias = nullptr);

// MatmulBf16 writing C in bfloat16: the f32 sums (bias included) rounded to
// nearest even once, as oneDNN rounds its bf16 destinations. For products whose
// result only feeds another bf16 product or a bf16 primitive.
void MatmulBf16ToBf16(const MatmulShape& shape, const uint16_t* a, const uint16_t* b, uint16_t* c,
                      const float* bias = nullptr);

// The same product from IEEE fp16 A and B (runtime/core/fp16.h), accumulated
// and written in fp32: what a GPU's fp16 tensor-core GEMM computes, up to the
// order of the sums. The CPU has no fp16 products here: the operands are
// widened (exactly) and multiplied by the fp32 Matmul, so every product of two
// fp16 values is exact as on the GPU. A reference and an emulation, slower
// than fp32. The widened operands live in a per-thread buffer that grows to the
// largest product's and stays (outside every allocator's accounting).
void MatmulF16(const MatmulShape& shape, const uint16_t* a, const uint16_t* b, float* c,
               const float* bias = nullptr);

// The oneDNN implementation chosen for a shape, e.g. "brg:avx512_core"; for tests
// and the profiler, which flag reference ("ref") fallbacks.
std::string MatmulImplementation(const MatmulShape& shape, bool bf16 = false);

}  // namespace tandem::cpu

#endif  // TANDEM_RUNTIME_CPU_MATMUL_H_
