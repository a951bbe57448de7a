// Weight layout kernels for convolutions on NHWC activations, launched on a
// caller's stream. The model keeps conv weights as PyTorch does, OIHW [O, I, KH,
// KW]; cuDNN's fast NHWC path wants the filter NHWC too, i.e. OHWI [O, KH, KW, I].
// The forward transposes OIHW -> OHWI before the call, the weight gradient comes
// back OHWI and is transposed (and added, when accumulating) into OIHW. Pure
// copies. Only in CUDA builds. Thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_CONV_LAYOUT_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_CONV_LAYOUT_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// out[o, kh, kw, i] = inp[o, i, kh, kw].
cudaError_t OihwToOhwi(float* out, const float* inp, int64_t O, int64_t I, int64_t KH, int64_t KW,
                       cudaStream_t stream);
// out[o, i, kh, kw] (+)= inp[o, kh, kw, i].
cudaError_t OhwiToOihw(float* out, const float* inp, int64_t O, int64_t I, int64_t KH, int64_t KW,
                       bool accumulate, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_CONV_LAYOUT_H_
