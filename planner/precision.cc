#include "planner/precision.h"

#include "absl/strings/str_cat.h"

namespace tandem::planner {

using tandem::v1::LayerProfile;
using tandem::v1::Precision;
using tandem::v1::Profile;

int ElementBytes(Precision precision) { return IsMixed(precision) ? 2 : 4; }

int64_t ParameterCount(const LayerProfile& layer, Precision precision) {
  if (layer.parameter_count() > 0) return layer.parameter_count();
  return layer.analytic_memory().parameter_bytes() / ElementBytes(precision);
}

namespace {

// One layer of an fp32 profile re-counted in a 16-bit precision.
void HalveLayer(LayerProfile* layer) {
  if (layer->kind() == "cross_entropy") return;  // softmax and loss stay fp32
  tandem::v1::LayerMemory* m = layer->mutable_analytic_memory();
  const int64_t params = ParameterCount(*layer, tandem::v1::PRECISION_FP32);
  // A layer without a gradient (frozen) has no update, so no master weights.
  const bool trained = m->gradient_bytes() > 0;
  if (trained) m->set_optimizer_state_bytes(m->optimizer_state_bytes() + 4 * params);
  m->set_parameter_bytes(2 * params);
  m->set_gradient_bytes(trained ? 2 * params : 0);
  // The runtime widens a call's weights to fp32 and accumulates its gradient
  // in fp32 (runtime/model/model.h, StateBytesOf).
  m->set_staging_bytes(trained ? 8 * params : 0);
  // An embedding's too: in the analytic profile it is the embedding's output;
  // the token indices beside it are a few bytes per sample.
  m->set_activation_bytes(m->activation_bytes() / 2);
  m->set_workspace_bytes(m->workspace_bytes() / 2);
  m->set_output_bytes(m->output_bytes() / 2);
  layer->set_forward_memory_bytes(layer->forward_memory_bytes() / 2);
  layer->set_backward_memory_bytes(layer->backward_memory_bytes() / 2);
}

}  // namespace

absl::StatusOr<Profile> ProfileInPrecision(const Profile& fp32, Precision precision) {
  if (IsMixed(fp32.precision()) && fp32.precision() == precision) return fp32;
  if (IsMixed(fp32.precision())) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.precision: already ", Precision_Name(fp32.precision()),
                     absl::StrCat("; it cannot be planned in ", PrecisionName(precision))));
  }
  Profile out = fp32;
  if (!IsMixed(precision)) {
    out.set_precision(tandem::v1::PRECISION_FP32);
    return out;
  }
  for (int i = 0; i < out.layers_size(); ++i) {
    if (out.layers(i).devices_size() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile.layers[", i,
                       "].devices: a measured profile is in the precision it ran in; only analytic "
                       "profiles are re-counted"));
    }
    HalveLayer(out.mutable_layers(i));
  }
  out.set_precision(precision);
  return out;
}

double MatmulPeak(const tandem::v1::ProcessorSpec& p, Precision precision) {
  double rate = 0;
  if (precision == tandem::v1::PRECISION_BF16) rate = p.peak_bf16_matmul_flops_per_second();
  if (precision == tandem::v1::PRECISION_FP16) rate = p.peak_fp16_matmul_flops_per_second();
  return rate > 0 ? rate : p.peak_matmul_flops_per_second();
}

}  // namespace tandem::planner
