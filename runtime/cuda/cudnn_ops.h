// cuDNN operations of the CNN layers on NHWC fp32 activations: convolution
// (forward, backward data, backward filter), pooling (max, and average counting
// the padding, as the CPU layer) and spatial batch normalisation, through the
// legacy cuDNN API that cuDNN 9 still ships (cudnn_cnn.h, cudnn_ops.h).
//
// Layouts. Activations are NHWC (Tandem's layout). Convolution filters are passed
// OHWI (cuDNN's NHWC filter format, "KRSC"): the model keeps weights OIHW as
// PyTorch does, and the Conv2d layer transposes them around these calls
// (kernels/conv_layout.h), because NHWC x with an NHWC filter is the layout
// cuDNN's fp32 and TF32 NHWC kernels take. Batch norm describes the NHWC tensor
// [B, H, W, C] as NCHW [B*H*W, C, 1, 1]: the same memory, and spatial batch norm
// over it normalises each channel over B*H*W values, as BatchNorm2d does.
//
// Algorithms. Convolution algorithms are chosen once per geometry, device and
// TF32 setting with cuDNN's heuristics (cudnnGet*Algorithm_v7, nothing is run),
// skipping any that fail, need more scratch than the context allows, or use
// tensor cores while TF32 is off; backward passes prefer deterministic
// algorithms. The choice is cached for the process. Scratch comes from
// CudaContext::Scratch.
//
// Everything runs on ctx->stream with ctx->cudnn. Errors come back as statuses
// (layers record them in the context). Only in CUDA builds. Thread-safe: the
// plan cache is locked; calls on one context must come from one thread.
#ifndef TANDEM_RUNTIME_CUDA_CUDNN_OPS_H_
#define TANDEM_RUNTIME_CUDA_CUDNN_OPS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/cuda/context.h"

namespace tandem::cuda {

// A square-kernel 2-d convolution (cross-correlation, as PyTorch's) of NHWC
// images, symmetric padding, no dilation or groups. `bf16`: every operand and
// result is bfloat16 (x, w, y, dx, dw; cuDNN's BFLOAT16 configuration on the
// tensor cores, fp32 accumulation), else fp32.
struct ConvGeometry {
  int64_t batch = 0, height = 0, width = 0, in_channels = 0;
  int64_t out_channels = 0, kernel = 0, stride = 1, padding = 0;
  int64_t out_height = 0, out_width = 0;
  bool bf16 = false;
};

// y [B, OH, OW, O] = conv(x [B, H, W, I], w [O, K, K, I]). Operands are float
// or, with g.bf16, uint16_t bfloat16 bit patterns.
absl::Status ConvolutionForward(CudaContext* ctx, const ConvGeometry& g, const void* x,
                                const void* w_ohwi, void* y);
// dx [B, H, W, I] = conv^T(dy, w) (overwritten).
absl::Status ConvolutionBackwardData(CudaContext* ctx, const ConvGeometry& g, const void* dy,
                                     const void* w_ohwi, void* dx);
// dw [O, K, K, I] = sum over the batch of x (*) dy (overwritten).
absl::Status ConvolutionBackwardFilter(CudaContext* ctx, const ConvGeometry& g, const void* x,
                                       const void* dy, void* dw_ohwi);
// Whether a bf16 layer should convolve `g` (its bf16 flag ignored) in bf16:
// the context's options().bf16_convolutions is set and cuDNN offers bf16
// algorithms for all three passes within the scratch limit (remembered per
// geometry). Layers convolve in fp32 where it is false.
bool Bf16ConvolutionAvailable(CudaContext* ctx, ConvGeometry g);
// The algorithms chosen for `g` on ctx's device and settings, e.g.
// "fwd=1(ws 0) bwd_data=1(ws 0) bwd_filter=1(ws 1024)"; for tests and profiles.
absl::StatusOr<std::string> ConvolutionAlgorithms(CudaContext* ctx, const ConvGeometry& g);

// A pooling window over NHWC images; the window is window_h x window_w with one
// stride and symmetric padding. Max pooling ignores the padding; average pooling
// divides by the full window, padding included (PyTorch's count_include_pad).
struct PoolGeometry {
  bool max = true;
  int64_t batch = 0, height = 0, width = 0, channels = 0;
  int64_t window_h = 0, window_w = 0, stride = 1, padding = 0;
  int64_t out_height = 0, out_width = 0;
};

absl::Status PoolingForward(CudaContext* ctx, const PoolGeometry& g, const float* x, float* y);
// cuDNN's pooling backward recomputes the max positions from x and y (no argmax
// is saved), so both are needed. Max pooling uses CUDNN_POOLING_MAX_DETERMINISTIC.
absl::Status PoolingBackward(CudaContext* ctx, const PoolGeometry& g, const float* x,
                             const float* y, const float* dy, float* dx);

// Spatial batch norm over `rows` = B*H*W rows of `channels` values (NHWC).
struct BatchNormGeometry {
  int64_t rows = 0;
  int64_t channels = 0;
  float epsilon = 1e-5f;
};

// Training: y = (x - mean) * inv_std * scale + shift with the batch's mean and
// biased variance; saves mean and inv_std = 1/sqrt(var + eps) [C] each. Running
// statistics are not touched (kernels/batchnorm.h updates them as the CPU does).
absl::Status BatchNormForwardTraining(CudaContext* ctx, const BatchNormGeometry& g, const float* x,
                                      float* y, const float* scale, const float* shift,
                                      float* save_mean, float* save_inv_std);
// Evaluation with given statistics (the running ones).
absl::Status BatchNormForwardInference(CudaContext* ctx, const BatchNormGeometry& g, const float* x,
                                       float* y, const float* scale, const float* shift,
                                       const float* mean, const float* variance);
// dx (overwritten; required), dscale and dshift (added to when accumulate_params).
absl::Status BatchNormBackward(CudaContext* ctx, const BatchNormGeometry& g, const float* x,
                               const float* dy, const float* scale, const float* save_mean,
                               const float* save_inv_std, float* dx, float* dscale, float* dshift,
                               bool accumulate_params);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDNN_OPS_H_
