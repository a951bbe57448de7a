// Matrix products on the GPU through cuBLAS, with the semantics of the CPU's
// cpu::Matmul (cpu/matmul.h), so a layer builds one cpu::MatmulShape and runs it
// on either device:
//
//   C[b] = alpha * op(A[b]) * op(B[b]) (+ bias) (+ C[b] if accumulate),  b < batch,
//
// row-major, op(X) = X or X^T, leading dimensions and batch strides in elements
// (0 = dense). cuBLAS is column-major: a row-major C is a column-major C^T, so the
// call computes C^T = op(B)^T op(A)^T with the operands swapped
// (cublasSgemmStridedBatched, m and n exchanged). The bias is broadcast into C
// first and the GEMM then accumulates (beta = 1).
//
// Precision: with the context's allow_tf32() the handle's math mode is
// CUBLAS_TF32_TENSOR_OP_MATH and products use TF32 (10-bit mantissa inputs, fp32
// accumulation); without it, full fp32. Runs on ctx->stream. Only in CUDA builds.
// Thread-safe as far as the context is (one thread per context).
#ifndef TANDEM_RUNTIME_CUDA_BLAS_H_
#define TANDEM_RUNTIME_CUDA_BLAS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cuda/context.h"

namespace tandem::cuda {

// All pointers are device memory. INVALID_ARGUMENT for shapes cuBLAS cannot take
// (dimensions or strides beyond int32); errors from cuBLAS otherwise. Nothing is
// recorded in ctx: callers decide (layers use ctx->Check).
absl::Status Matmul(CudaContext* ctx, const cpu::MatmulShape& shape, const float* a, const float* b,
                    float* c, const float* bias = nullptr);

// The same product from bfloat16 A and B (bit patterns; cuda::ToBf16 makes them)
// on the tensor cores, with fp32 accumulation (CUBLAS_COMPUTE_32F) and an fp32 C
// and bias: cpu::MatmulBf16's contract, whatever the context's TF32 setting.
absl::Status MatmulBf16(CudaContext* ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                        const uint16_t* b, float* c, const float* bias = nullptr);

// The same from IEEE fp16 A and B (cuda::ToF16 makes them), fp32 accumulation
// and an fp32 C and bias: cpu::MatmulF16's contract.
absl::Status MatmulF16(CudaContext* ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                       const uint16_t* b, float* c, const float* bias = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_BLAS_H_
