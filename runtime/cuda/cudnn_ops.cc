#include "runtime/cuda/cudnn_ops.h"

#include <climits>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"

namespace tandem::cuda {
namespace {

constexpr float kOne = 1.0f, kZero = 0.0f;

absl::StatusOr<int> ToInt(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(what, " = ", v, " is out of cuDNN's int range"));
  }
  return static_cast<int>(v);
}

// Owning wrappers of the descriptors a plan holds; plans live for the process.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  ~TensorDesc() {
    if (d) cudnnDestroyTensorDescriptor(d);
  }
  absl::Status Nhwc(int64_t n, int64_t h, int64_t w, int64_t c,
                    cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    TANDEM_RETURN_IF_ERROR(
        CudnnStatus(cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor"));
    TANDEM_ASSIGN_OR_RETURN(int in, ToInt(n, "batch"));
    TANDEM_ASSIGN_OR_RETURN(int ih, ToInt(h, "height"));
    TANDEM_ASSIGN_OR_RETURN(int iw, ToInt(w, "width"));
    TANDEM_ASSIGN_OR_RETURN(int ic, ToInt(c, "channels"));
    return CudnnStatus(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, type, in, ic, ih, iw),
                       "cudnnSetTensor4dDescriptor");
  }
  absl::Status Nchw(int64_t n, int64_t c, int64_t h, int64_t w) {
    TANDEM_RETURN_IF_ERROR(
        CudnnStatus(cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor"));
    TANDEM_ASSIGN_OR_RETURN(int in, ToInt(n, "rows"));
    TANDEM_ASSIGN_OR_RETURN(int ic, ToInt(c, "channels"));
    return CudnnStatus(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, in, ic,
                                                  static_cast<int>(h), static_cast<int>(w)),
                       "cudnnSetTensor4dDescriptor");
  }
};

struct ConvPlan {
  TensorDesc x, y;
  cudnnFilterDescriptor_t w = nullptr;
  // One convolution descriptor per pass: each carries its algorithm's math type.
  cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;

  ~ConvPlan() {
    if (w) cudnnDestroyFilterDescriptor(w);
    for (auto d : {fwd, bwd_data, bwd_filter}) {
      if (d) cudnnDestroyConvolutionDescriptor(d);
    }
  }
};

// Picks the heuristics' best usable algorithm. Backward passes first look for a
// deterministic one. `allow_tensor_ops`: TF32 allowed, or bf16 operands.
template <typename Perf>
absl::StatusOr<Perf> Choose(const std::vector<Perf>& results, size_t max_ws, bool allow_tensor_ops,
                            bool prefer_deterministic, const char* pass) {
  for (int strict = prefer_deterministic ? 1 : 0; strict >= 0; --strict) {
    for (const Perf& p : results) {
      if (p.status != CUDNN_STATUS_SUCCESS || p.memory > max_ws) continue;
      if (!allow_tensor_ops && p.mathType != CUDNN_DEFAULT_MATH && p.mathType != CUDNN_FMA_MATH) {
        continue;
      }
      if (strict && p.determinism != CUDNN_DETERMINISTIC) continue;
      return p;
    }
  }
  return absl::UnimplementedError(
      absl::StrCat("cuDNN offers no ", pass, " convolution algorithm within ", max_ws,
                   " bytes of scratch", allow_tensor_ops ? "" : " without TF32"));
}

absl::Status NewConvDesc(const ConvGeometry& g, cudnnConvolutionDescriptor_t* d) {
  TANDEM_RETURN_IF_ERROR(
      CudnnStatus(cudnnCreateConvolutionDescriptor(d), "cudnnCreateConvolutionDescriptor"));
  return CudnnStatus(
      cudnnSetConvolution2dDescriptor(*d, static_cast<int>(g.padding), static_cast<int>(g.padding),
                                      static_cast<int>(g.stride), static_cast<int>(g.stride), 1, 1,
                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
      "cudnnSetConvolution2dDescriptor");
}

// Sets the math type the chosen algorithm asks for; FMA only when TF32 is off
// (CUDNN_DEFAULT_MATH lets cuDNN use TF32 on Ampere and later).
absl::Status SetMath(cudnnConvolutionDescriptor_t d, cudnnMathType_t chosen, bool allow_tf32) {
  return CudnnStatus(cudnnSetConvolutionMathType(d, allow_tf32 ? chosen : CUDNN_FMA_MATH),
                     "cudnnSetConvolutionMathType");
}

absl::StatusOr<std::unique_ptr<ConvPlan>> MakeConvPlan(CudaContext* ctx, const ConvGeometry& g) {
  for (int64_t v : {g.batch, g.height, g.width, g.in_channels, g.out_channels, g.kernel, g.stride,
                    g.padding, g.out_height, g.out_width}) {
    TANDEM_RETURN_IF_ERROR(ToInt(v, "convolution dimension").status());
  }
  auto plan = std::make_unique<ConvPlan>();
  const cudnnDataType_t type = g.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  TANDEM_RETURN_IF_ERROR(plan->x.Nhwc(g.batch, g.height, g.width, g.in_channels, type));
  TANDEM_RETURN_IF_ERROR(plan->y.Nhwc(g.batch, g.out_height, g.out_width, g.out_channels, type));
  TANDEM_RETURN_IF_ERROR(
      CudnnStatus(cudnnCreateFilterDescriptor(&plan->w), "cudnnCreateFilterDescriptor"));
  TANDEM_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetFilter4dDescriptor(plan->w, type, CUDNN_TENSOR_NHWC, static_cast<int>(g.out_channels),
                                 static_cast<int>(g.in_channels), static_cast<int>(g.kernel),
                                 static_cast<int>(g.kernel)),
      "cudnnSetFilter4dDescriptor"));
  TANDEM_RETURN_IF_ERROR(NewConvDesc(g, &plan->fwd));
  TANDEM_RETURN_IF_ERROR(NewConvDesc(g, &plan->bwd_data));
  TANDEM_RETURN_IF_ERROR(NewConvDesc(g, &plan->bwd_filter));
  // Heuristics honour the descriptor's math type: with TF32 off, ask with FMA;
  // bf16 operands are for the tensor cores whatever the TF32 setting.
  const bool tf32 = ctx->allow_tf32() || g.bf16;
  const cudnnMathType_t ask = tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  for (auto d : {plan->fwd, plan->bwd_data, plan->bwd_filter}) {
    TANDEM_RETURN_IF_ERROR(
        CudnnStatus(cudnnSetConvolutionMathType(d, ask), "cudnnSetConvolutionMathType"));
  }
  const size_t max_ws = static_cast<size_t>(ctx->options().max_conv_workspace_bytes);
  int returned = 0;
  {
    std::vector<cudnnConvolutionFwdAlgoPerf_t> r(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    TANDEM_RETURN_IF_ERROR(CudnnStatus(
        cudnnGetConvolutionForwardAlgorithm_v7(ctx->cudnn, plan->x.d, plan->w, plan->fwd, plan->y.d,
                                               static_cast<int>(r.size()), &returned, r.data()),
        "cudnnGetConvolutionForwardAlgorithm_v7"));
    r.resize(returned);
    TANDEM_ASSIGN_OR_RETURN(auto p, Choose(r, max_ws, tf32, false, "forward"));
    plan->fwd_algo = p.algo;
    plan->fwd_ws = p.memory;
    TANDEM_RETURN_IF_ERROR(SetMath(plan->fwd, p.mathType, tf32));
  }
  {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> r(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    TANDEM_RETURN_IF_ERROR(CudnnStatus(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx->cudnn, plan->w, plan->y.d, plan->bwd_data,
                                                    plan->x.d, static_cast<int>(r.size()),
                                                    &returned, r.data()),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7"));
    r.resize(returned);
    TANDEM_ASSIGN_OR_RETURN(auto p, Choose(r, max_ws, tf32, true, "backward-data"));
    plan->bwd_data_algo = p.algo;
    plan->bwd_data_ws = p.memory;
    TANDEM_RETURN_IF_ERROR(SetMath(plan->bwd_data, p.mathType, tf32));
  }
  {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> r(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    TANDEM_RETURN_IF_ERROR(
        CudnnStatus(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                        ctx->cudnn, plan->x.d, plan->y.d, plan->bwd_filter, plan->w,
                        static_cast<int>(r.size()), &returned, r.data()),
                    "cudnnGetConvolutionBackwardFilterAlgorithm_v7"));
    r.resize(returned);
    TANDEM_ASSIGN_OR_RETURN(auto p, Choose(r, max_ws, tf32, true, "backward-filter"));
    plan->bwd_filter_algo = p.algo;
    plan->bwd_filter_ws = p.memory;
    TANDEM_RETURN_IF_ERROR(SetMath(plan->bwd_filter, p.mathType, tf32));
  }
  return plan;
}

// Process-wide caches of plans by geometry and device settings. Entries are
// never evicted: a model has a handful of shapes per batch size.
template <typename Key, typename Plan>
class PlanCache {
 public:
  template <typename Make>
  absl::StatusOr<const Plan*> Get(const Key& key, Make make) {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.get();
    // Built under the lock: creation is rare and cuDNN's heuristics are cheap.
    absl::StatusOr<std::unique_ptr<Plan>> plan = make();
    if (!plan.ok()) return plan.status();
    return plans_.emplace(key, std::move(plan).value()).first->second.get();
  }

 private:
  absl::Mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_ ABSL_GUARDED_BY(mu_);
};

using ConvKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int, bool, int64_t, bool>;

absl::StatusOr<const ConvPlan*> GetConvPlan(CudaContext* ctx, const ConvGeometry& g) {
  static auto* cache = new PlanCache<ConvKey, ConvPlan>();
  const ConvKey key(g.batch, g.height, g.width, g.in_channels, g.out_channels, g.kernel, g.stride,
                    g.padding, ctx->device, ctx->allow_tf32(),
                    ctx->options().max_conv_workspace_bytes, g.bf16);
  return cache->Get(key, [&] { return MakeConvPlan(ctx, g); });
}

// Scratch for `bytes`, or the recorded allocation failure.
absl::StatusOr<void*> Workspace(CudaContext* ctx, size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ctx->Scratch(static_cast<int64_t>(bytes));
  if (p == nullptr) return absl::ResourceExhaustedError("no scratch for a cuDNN algorithm");
  return p;
}

struct PoolPlan {
  TensorDesc x, y;
  cudnnPoolingDescriptor_t pool = nullptr;
  ~PoolPlan() {
    if (pool) cudnnDestroyPoolingDescriptor(pool);
  }
};

using PoolKey =
    std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

absl::StatusOr<const PoolPlan*> GetPoolPlan(const PoolGeometry& g) {
  static auto* cache = new PlanCache<PoolKey, PoolPlan>();
  const PoolKey key(g.max, g.batch, g.height, g.width, g.channels, g.window_h, g.window_w, g.stride,
                    g.padding);
  return cache->Get(key, [&]() -> absl::StatusOr<std::unique_ptr<PoolPlan>> {
    for (int64_t v : {g.window_h, g.window_w, g.stride, g.padding}) {
      TANDEM_RETURN_IF_ERROR(ToInt(v, "pooling window").status());
    }
    auto plan = std::make_unique<PoolPlan>();
    TANDEM_RETURN_IF_ERROR(plan->x.Nhwc(g.batch, g.height, g.width, g.channels));
    TANDEM_RETURN_IF_ERROR(plan->y.Nhwc(g.batch, g.out_height, g.out_width, g.channels));
    TANDEM_RETURN_IF_ERROR(
        CudnnStatus(cudnnCreatePoolingDescriptor(&plan->pool), "cudnnCreatePoolingDescriptor"));
    TANDEM_RETURN_IF_ERROR(CudnnStatus(
        cudnnSetPooling2dDescriptor(
            plan->pool,
            g.max ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
            CUDNN_PROPAGATE_NAN, static_cast<int>(g.window_h), static_cast<int>(g.window_w),
            static_cast<int>(g.padding), static_cast<int>(g.padding), static_cast<int>(g.stride),
            static_cast<int>(g.stride)),
        "cudnnSetPooling2dDescriptor"));
    return plan;
  });
}

struct BatchNormPlan {
  TensorDesc x, stats;
};

absl::StatusOr<const BatchNormPlan*> GetBatchNormPlan(const BatchNormGeometry& g) {
  static auto* cache = new PlanCache<std::pair<int64_t, int64_t>, BatchNormPlan>();
  return cache->Get({g.rows, g.channels}, [&]() -> absl::StatusOr<std::unique_ptr<BatchNormPlan>> {
    auto plan = std::make_unique<BatchNormPlan>();
    // NHWC [B, H, W, C] is NCHW [B*H*W, C, 1, 1] in memory; spatial batch norm
    // reduces over N, H, W, i.e. over the B*H*W rows.
    TANDEM_RETURN_IF_ERROR(plan->x.Nchw(g.rows, g.channels, 1, 1));
    TANDEM_RETURN_IF_ERROR(
        CudnnStatus(cudnnCreateTensorDescriptor(&plan->stats.d), "cudnnCreateTensorDescriptor"));
    TANDEM_RETURN_IF_ERROR(CudnnStatus(
        cudnnDeriveBNTensorDescriptor(plan->stats.d, plan->x.d, CUDNN_BATCHNORM_SPATIAL),
        "cudnnDeriveBNTensorDescriptor"));
    return plan;
  });
}

}  // namespace

absl::Status ConvolutionForward(CudaContext* ctx, const ConvGeometry& g, const void* x,
                                const void* w_ohwi, void* y) {
  TANDEM_ASSIGN_OR_RETURN(const ConvPlan* p, GetConvPlan(ctx, g));
  TANDEM_ASSIGN_OR_RETURN(void* ws, Workspace(ctx, p->fwd_ws));
  return CudnnStatus(cudnnConvolutionForward(ctx->cudnn, &kOne, p->x.d, x, p->w, w_ohwi, p->fwd,
                                             p->fwd_algo, ws, p->fwd_ws, &kZero, p->y.d, y),
                     "cudnnConvolutionForward");
}

absl::Status ConvolutionBackwardData(CudaContext* ctx, const ConvGeometry& g, const void* dy,
                                     const void* w_ohwi, void* dx) {
  TANDEM_ASSIGN_OR_RETURN(const ConvPlan* p, GetConvPlan(ctx, g));
  TANDEM_ASSIGN_OR_RETURN(void* ws, Workspace(ctx, p->bwd_data_ws));
  return CudnnStatus(
      cudnnConvolutionBackwardData(ctx->cudnn, &kOne, p->w, w_ohwi, p->y.d, dy, p->bwd_data,
                                   p->bwd_data_algo, ws, p->bwd_data_ws, &kZero, p->x.d, dx),
      "cudnnConvolutionBackwardData");
}

absl::Status ConvolutionBackwardFilter(CudaContext* ctx, const ConvGeometry& g, const void* x,
                                       const void* dy, void* dw_ohwi) {
  TANDEM_ASSIGN_OR_RETURN(const ConvPlan* p, GetConvPlan(ctx, g));
  TANDEM_ASSIGN_OR_RETURN(void* ws, Workspace(ctx, p->bwd_filter_ws));
  return CudnnStatus(cudnnConvolutionBackwardFilter(ctx->cudnn, &kOne, p->x.d, x, p->y.d, dy,
                                                    p->bwd_filter, p->bwd_filter_algo, ws,
                                                    p->bwd_filter_ws, &kZero, p->w, dw_ohwi),
                     "cudnnConvolutionBackwardFilter");
}

absl::StatusOr<std::string> ConvolutionAlgorithms(CudaContext* ctx, const ConvGeometry& g) {
  TANDEM_ASSIGN_OR_RETURN(const ConvPlan* p, GetConvPlan(ctx, g));
  return absl::StrCat("fwd=", static_cast<int>(p->fwd_algo), "(ws ", p->fwd_ws,
                      ") bwd_data=", static_cast<int>(p->bwd_data_algo), "(ws ", p->bwd_data_ws,
                      ") bwd_filter=", static_cast<int>(p->bwd_filter_algo), "(ws ",
                      p->bwd_filter_ws, ")");
}

bool Bf16ConvolutionAvailable(CudaContext* ctx, ConvGeometry g) {
  if (!ctx->options().bf16_convolutions) return false;
  g.bf16 = true;
  static absl::Mutex mu(absl::kConstInit);
  static auto* known = new std::map<ConvKey, bool>();
  const ConvKey key(g.batch, g.height, g.width, g.in_channels, g.out_channels, g.kernel, g.stride,
                    g.padding, ctx->device, ctx->allow_tf32(),
                    ctx->options().max_conv_workspace_bytes, true);
  absl::MutexLock lock(&mu);
  auto it = known->find(key);
  if (it != known->end()) return it->second;
  const bool available = GetConvPlan(ctx, g).ok();
  known->emplace(key, available);
  return available;
}

absl::Status PoolingForward(CudaContext* ctx, const PoolGeometry& g, const float* x, float* y) {
  TANDEM_ASSIGN_OR_RETURN(const PoolPlan* p, GetPoolPlan(g));
  return CudnnStatus(cudnnPoolingForward(ctx->cudnn, p->pool, &kOne, p->x.d, x, &kZero, p->y.d, y),
                     "cudnnPoolingForward");
}

absl::Status PoolingBackward(CudaContext* ctx, const PoolGeometry& g, const float* x,
                             const float* y, const float* dy, float* dx) {
  TANDEM_ASSIGN_OR_RETURN(const PoolPlan* p, GetPoolPlan(g));
  return CudnnStatus(cudnnPoolingBackward(ctx->cudnn, p->pool, &kOne, p->y.d, y, p->y.d, dy, p->x.d,
                                          x, &kZero, p->x.d, dx),
                     "cudnnPoolingBackward");
}

absl::Status BatchNormForwardTraining(CudaContext* ctx, const BatchNormGeometry& g, const float* x,
                                      float* y, const float* scale, const float* shift,
                                      float* save_mean, float* save_inv_std) {
  TANDEM_ASSIGN_OR_RETURN(const BatchNormPlan* p, GetBatchNormPlan(g));
  // No running statistics here (both null): the layer updates them with the CPU's
  // formula from the saved ones.
  return CudnnStatus(cudnnBatchNormalizationForwardTraining(
                         ctx->cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, p->x.d, x, p->x.d, y,
                         p->stats.d, scale, shift, /*exponentialAverageFactor=*/0.0, nullptr,
                         nullptr, static_cast<double>(g.epsilon), save_mean, save_inv_std),
                     "cudnnBatchNormalizationForwardTraining");
}

absl::Status BatchNormForwardInference(CudaContext* ctx, const BatchNormGeometry& g, const float* x,
                                       float* y, const float* scale, const float* shift,
                                       const float* mean, const float* variance) {
  TANDEM_ASSIGN_OR_RETURN(const BatchNormPlan* p, GetBatchNormPlan(g));
  return CudnnStatus(cudnnBatchNormalizationForwardInference(
                         ctx->cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, p->x.d, x, p->x.d, y,
                         p->stats.d, scale, shift, mean, variance, static_cast<double>(g.epsilon)),
                     "cudnnBatchNormalizationForwardInference");
}

absl::Status BatchNormBackward(CudaContext* ctx, const BatchNormGeometry& g, const float* x,
                               const float* dy, const float* scale, const float* save_mean,
                               const float* save_inv_std, float* dx, float* dscale, float* dshift,
                               bool accumulate_params) {
  TANDEM_ASSIGN_OR_RETURN(const BatchNormPlan* p, GetBatchNormPlan(g));
  const float param_beta = accumulate_params ? 1.0f : 0.0f;
  return CudnnStatus(cudnnBatchNormalizationBackward(
                         ctx->cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &param_beta,
                         p->x.d, x, p->x.d, dy, p->x.d, dx, p->stats.d, scale, dscale, dshift,
                         static_cast<double>(g.epsilon), save_mean, save_inv_std),
                     "cudnnBatchNormalizationBackward");
}

}  // namespace tandem::cuda
