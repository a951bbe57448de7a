#include "runtime/layers/gradient_check.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "runtime/core/random.h"

namespace tandem {
namespace {

struct Harness {
  const Layer& layer;
  const GradientCheckOptions& o;
  std::vector<float> params, buffers, x, y, r, saved_bytes_storage, workspace;
  std::vector<int32_t> xi, targets;
  void* saved = nullptr;

  Harness(const Layer& l, const GradientCheckOptions& opts) : layer(l), o(opts) {
    params.resize(layer.ParamCount());
    buffers.resize(layer.BufferCount());
    layer.Initialize(params.data(), buffers.data(), o.seed, 11);
    const int64_t in_n = o.batch * layer.input_shape().elements();
    if (layer.input_dtype() == DType::kI32) {
      xi.resize(in_n);
      for (int64_t i = 0; i < in_n; ++i) {
        xi[i] = static_cast<int32_t>(UniformAt(o.seed, 3, i) * o.int_input_limit);
      }
    } else {
      x.resize(in_n);
      FillUniform(x.data(), in_n, -o.input_range, o.input_range, o.seed, 3);
    }
    y.resize(o.batch * layer.output_shape().elements());
    r.resize(y.size());
    FillUniform(r.data(), r.size(), -1.0f, 1.0f, o.seed, 5);
    saved_bytes_storage.resize((layer.SavedBytes(o.batch) + 3) / 4 + 1);
    saved = saved_bytes_storage.data();
    workspace.resize((layer.WorkspaceBytes(o.batch) + 3) / 4 + 16);
    if (o.target_limit > 0) {
      targets.resize(o.batch * o.targets_per_sample);
      for (size_t i = 0; i < targets.size(); ++i) {
        targets[i] = static_cast<int32_t>(UniformAt(o.seed, 9, i) * o.target_limit);
      }
    }
  }

  Tensor X() {
    const Shape s = layer.input_shape().WithBatch(o.batch);
    return xi.empty() ? Tensor::F32(x.data(), s) : Tensor::I32(xi.data(), s);
  }
  Tensor Y() { return Tensor::F32(y.data(), layer.output_shape().WithBatch(o.batch)); }

  LayerContext Context(float* grads) {
    LayerContext ctx;
    ctx.params = params.data();
    ctx.grads = grads;
    ctx.buffers = buffers.data();
    ctx.training = o.training;
    ctx.seed = o.seed;
    ctx.rng_stream = 77;
    ctx.workspace = workspace.data();
    ctx.targets = targets.empty() ? nullptr : targets.data();
    return ctx;
  }

  double Loss() {
    // Buffers (running statistics) must not drift between evaluations.
    std::vector<float> kept = buffers;
    layer.Forward(Context(nullptr), X(), Y(), saved);
    buffers = kept;
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(y[i]) * r[i];
    return l;
  }
};

// Checks values[offset, offset + n) against analytic[offset, offset + n).
void CheckTensor(Harness& h, const std::string& what, std::vector<float>& values,
                 const std::vector<float>& analytic, int64_t offset, int64_t n,
                 GradientCheckResult* result) {
  if (n == 0) return;
  const int64_t checks = std::min<int64_t>(n, h.o.max_checks);
  for (int64_t c = 0; c < checks; ++c) {
    const int64_t i = offset + (checks == n ? c : (c * (n - 1)) / std::max<int64_t>(1, checks - 1));
    const float original = values[i];
    values[i] = original + h.o.eps;
    const double plus = h.Loss();
    values[i] = original - h.o.eps;
    const double minus = h.Loss();
    values[i] = original;
    const double numeric = (plus - minus) / (2.0 * h.o.eps);
    const double a = analytic[i];
    const double scale = std::max({std::fabs(numeric), std::fabs(a), h.o.atol_floor});
    const double rel = std::fabs(numeric - a) / scale;
    result->max_rel_error = std::max(result->max_rel_error, rel);
    ++result->checked;
    if (rel > h.o.rtol) {
      ++result->failed;
      if (result->failures.size() < 10) {
        result->failures.push_back(absl::StrFormat("%s[%d]: analytic %.6g numeric %.6g (rel %.3g)",
                                                   what, i - offset, a, numeric, rel));
      }
    }
  }
}

}  // namespace

GradientCheckResult CheckGradients(const Layer& layer, const GradientCheckOptions& options) {
  Harness h(layer, options);
  GradientCheckResult result;
  // Analytic gradients.
  std::vector<float> grads(h.params.size(), 0.0f);
  std::vector<float> dx(h.x.size(), 0.0f);
  std::vector<float> kept = h.buffers;
  layer.Forward(h.Context(grads.data()), h.X(), h.Y(), h.saved);
  h.buffers = kept;
  const Tensor dy = Tensor::F32(h.r.data(), layer.output_shape().WithBatch(options.batch));
  const Tensor dxt =
      (options.check_input && !h.x.empty())
          ? Tensor::F32(dx.data(), layer.input_shape().WithBatch(options.batch))
          : Tensor(nullptr, DType::kF32, layer.input_shape().WithBatch(options.batch));
  layer.Backward(h.Context(grads.data()), h.X(), h.Y(), h.saved, dy, dxt);
  if (dxt.data != nullptr) CheckTensor(h, "dx", h.x, dx, 0, h.x.size(), &result);
  int64_t offset = 0;
  for (const ParamSpec& p : layer.Params()) {
    CheckTensor(h, "d" + p.name, h.params, grads, offset, p.shape.elements(), &result);
    offset += p.shape.elements();
  }
  return result;
}

}  // namespace tandem
