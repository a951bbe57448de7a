#include "runtime/cuda/blas.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/cuda/kernels/elementwise.h"

namespace tandem::cuda {

namespace {

// Matmul, MatmulBf16 and MatmulF16: the checks, the bias and k == 0 are the
// same; `half` says what a and b point at (CUDA_R_32F: fp32, through SGEMM).
absl::Status Gemm(CudaContext* ctx, const cpu::MatmulShape& s, const void* a, const void* b,
                  cudaDataType_t half, float* c, const float* bias) {
  const int64_t lda = s.lda ? s.lda : (s.trans_a ? s.m : s.k);
  const int64_t ldb = s.ldb ? s.ldb : (s.trans_b ? s.k : s.n);
  const int64_t ldc = s.ldc ? s.ldc : s.n;
  const int64_t bsa = s.batch_stride_a ? s.batch_stride_a : s.m * s.k;
  const int64_t bsb = s.batch_stride_b ? s.batch_stride_b : s.k * s.n;
  const int64_t bsc = s.batch_stride_c ? s.batch_stride_c : s.m * s.n;
  for (int64_t v : {s.m, s.n, s.k, s.batch, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("GEMM dimension ", v, " out of cuBLAS's int range (m=", s.m, " n=", s.n,
                       " k=", s.k, " batch=", s.batch, ")"));
    }
  }
  if (s.m == 0 || s.n == 0 || s.batch == 0) return absl::OkStatus();
  bool accumulate = s.accumulate;
  if (s.bias) {
    if (bias == nullptr) return absl::InvalidArgumentError("GEMM with bias but no bias pointer");
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(BroadcastBias(c, bias, s.batch, s.m, s.n, ldc, bsc, s.accumulate, ctx->stream),
                   "BroadcastBias"));
    accumulate = true;
  }
  const float alpha = s.alpha, beta = accumulate ? 1.0f : 0.0f;
  // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m). A row-major
  // matrix stored as-is reads, column-major, as its transpose, so op(B)^T is B's
  // storage untransposed when !trans_b.
  const cublasOperation_t op_b = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (s.k == 0) {
    // No products: C = beta * C (+ bias already there).
    if (!accumulate) {
      for (int64_t i = 0; i < s.batch; ++i) {
        TANDEM_RETURN_IF_ERROR(CudaStatus(cudaMemset2DAsync(c + i * bsc, ldc * sizeof(float), 0,
                                                            s.n * sizeof(float), s.m, ctx->stream),
                                          "cudaMemset2DAsync"));
      }
    }
    return absl::OkStatus();
  }
  if (half != CUDA_R_32F) {
    return CublasStatus(
        cublasGemmStridedBatchedEx(
            ctx->cublas, op_b, op_a, static_cast<int>(s.n), static_cast<int>(s.m),
            static_cast<int>(s.k), &alpha, b, half, static_cast<int>(ldb), bsb, a, half,
            static_cast<int>(lda), bsa, &beta, c, CUDA_R_32F, static_cast<int>(ldc), bsc,
            static_cast<int>(s.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        half == CUDA_R_16BF ? "cublasGemmStridedBatchedEx (bf16)"
                            : "cublasGemmStridedBatchedEx (fp16)");
  }
  return CublasStatus(
      cublasSgemmStridedBatched(ctx->cublas, op_b, op_a, static_cast<int>(s.n),
                                static_cast<int>(s.m), static_cast<int>(s.k), &alpha,
                                static_cast<const float*>(b), static_cast<int>(ldb), bsb,
                                static_cast<const float*>(a), static_cast<int>(lda), bsa, &beta, c,
                                static_cast<int>(ldc), bsc, static_cast<int>(s.batch)),
      "cublasSgemmStridedBatched");
}

}  // namespace

absl::Status Matmul(CudaContext* ctx, const cpu::MatmulShape& shape, const float* a, const float* b,
                    float* c, const float* bias) {
  return Gemm(ctx, shape, a, b, CUDA_R_32F, c, bias);
}

absl::Status MatmulBf16(CudaContext* ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                        const uint16_t* b, float* c, const float* bias) {
  return Gemm(ctx, shape, a, b, CUDA_R_16BF, c, bias);
}

absl::Status MatmulF16(CudaContext* ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                       const uint16_t* b, float* c, const float* bias) {
  return Gemm(ctx, shape, a, b, CUDA_R_16F, c, bias);
}

}  // namespace tandem::cuda
