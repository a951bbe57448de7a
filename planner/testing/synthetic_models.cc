#include "planner/testing/synthetic_models.h"

#include "absl/strings/str_cat.h"

namespace tandem::planner::testing {
namespace {

using tandem::v1::LayerProfile;
using tandem::v1::Profile;

void SetTiming(double seconds, tandem::v1::PhaseProfile* phase) {
  phase->mutable_timing()->set_samples(10);
  phase->mutable_timing()->set_median_seconds(seconds);
  phase->mutable_timing()->set_mean_seconds(seconds);
}

LayerProfile* AddLayer(const std::string& name, const std::string& kind, Profile* profile) {
  LayerProfile* layer = profile->add_layers();
  layer->set_index(profile->layers_size() - 1);
  layer->set_name(name);
  layer->set_kind(kind);
  return layer;
}

// Adam in fp32: gradient = parameters, two state tensors.
void SetStateBytes(int64_t parameters, LayerProfile* layer) {
  layer->set_parameter_count(parameters);
  tandem::v1::LayerMemory* m = layer->mutable_analytic_memory();
  m->set_parameter_bytes(4 * parameters);
  m->set_gradient_bytes(4 * parameters);
  m->set_optimizer_state_bytes(8 * parameters);
}

void AddLinear(const std::string& name, int64_t n_in, int64_t n_out, int64_t b, Profile* profile) {
  LayerProfile* layer = AddLayer(name, "linear", profile);
  const int64_t params = n_in * n_out + n_out;
  SetStateBytes(params, layer);
  layer->set_forward_flops(2.0 * b * n_in * n_out);
  layer->set_backward_flops(4.0 * b * n_in * n_out);
  layer->set_forward_memory_bytes(4.0 * (params + b * n_in + b * n_out));
  layer->set_backward_memory_bytes(8.0 * (params + b * n_in + b * n_out));
  layer->mutable_analytic_memory()->set_activation_bytes(4 * b * n_in);
  layer->mutable_analytic_memory()->set_output_bytes(4 * b * n_out);
}

void AddElementwise(const std::string& name, const std::string& kind, int64_t elements,
                    Profile* profile) {
  LayerProfile* layer = AddLayer(name, kind, profile);
  layer->set_forward_flops(static_cast<double>(elements));
  layer->set_backward_flops(static_cast<double>(elements));
  layer->set_forward_memory_bytes(8.0 * elements);
  layer->set_backward_memory_bytes(12.0 * elements);
  layer->mutable_analytic_memory()->set_activation_bytes(4 * elements);
  layer->mutable_analytic_memory()->set_output_bytes(4 * elements);
}

void AddCrossEntropy(int64_t rows, int64_t classes, Profile* profile) {
  LayerProfile* layer = AddLayer("loss", "cross_entropy", profile);
  layer->set_forward_flops(5.0 * rows * classes);
  layer->set_backward_flops(2.0 * rows * classes);
  layer->set_forward_memory_bytes(8.0 * rows * classes);
  layer->set_backward_memory_bytes(8.0 * rows * classes);
  layer->mutable_analytic_memory()->set_activation_bytes(4 * rows * classes);
  layer->mutable_analytic_memory()->set_output_bytes(4 * rows);
}

void Finish(int batch_size, Profile* profile) {
  profile->set_batch_size(batch_size);
  profile->set_optimizer_state_per_parameter(2);
  profile->mutable_provenance()->set_source("synthetic");
}

}  // namespace

Profile MeasuredChainProfile(const std::vector<SyntheticLayer>& layers, int batch_size,
                             const SyntheticNode& node) {
  Profile profile;
  Finish(batch_size, &profile);
  profile.mutable_provenance()->set_source("measured");
  tandem::v1::DeviceProfile* cpu = profile.add_devices();
  cpu->set_id("cpu");
  cpu->set_kind(tandem::v1::DEVICE_KIND_CPU);
  cpu->set_threads(node.host_threads);
  cpu->set_memory_bytes(node.host_memory_bytes);
  cpu->set_memory_bandwidth_bytes_per_second(node.host_memory_bytes_per_second);
  tandem::v1::DeviceProfile* gpu = profile.add_devices();
  gpu->set_id("cuda:0");
  gpu->set_kind(tandem::v1::DEVICE_KIND_CUDA);
  gpu->set_memory_bytes(node.accelerator_memory_bytes);
  gpu->set_memory_bandwidth_bytes_per_second(1e12);
  const std::pair<tandem::v1::LinkDirection, double> links[] = {
      {tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, node.h2d_bytes_per_second},
      {tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, node.d2h_bytes_per_second},
  };
  for (const auto& [direction, bandwidth] : links) {
    tandem::v1::LinkProfile* link = profile.add_links();
    link->set_direction(direction);
    link->set_pinned(true);
    link->set_bandwidth_bytes_per_second(bandwidth);
    link->set_latency_seconds(node.link_latency_seconds);
  }
  for (const SyntheticLayer& s : layers) {
    LayerProfile* layer = AddLayer(s.name, "linear", &profile);
    tandem::v1::LayerMemory* m = layer->mutable_analytic_memory();
    m->set_parameter_bytes(s.parameter_bytes);
    m->set_gradient_bytes(s.parameter_bytes);
    m->set_optimizer_state_bytes(s.optimizer_state_bytes >= 0 ? s.optimizer_state_bytes
                                                              : 2 * s.parameter_bytes);
    m->set_activation_bytes(s.activation_bytes);
    m->set_workspace_bytes(s.workspace_bytes);
    m->set_output_bytes(s.output_bytes);
    layer->set_parameter_count(s.parameter_bytes / 4);
    tandem::v1::LayerDeviceProfile* host = layer->add_devices();
    host->set_device_id("cpu");
    SetTiming(s.host_forward_seconds, host->mutable_forward());
    SetTiming(s.host_backward_seconds, host->mutable_backward());
    SetTiming(s.host_update_seconds, host->mutable_update());
    tandem::v1::LayerDeviceProfile* acc = layer->add_devices();
    acc->set_device_id("cuda:0");
    SetTiming(s.accelerator_forward_seconds, acc->mutable_forward());
    SetTiming(s.accelerator_backward_seconds, acc->mutable_backward());
    SetTiming(s.accelerator_update_seconds, acc->mutable_update());
  }
  return profile;
}

Profile MlpProfile(const std::vector<int64_t>& widths, int batch_size) {
  Profile profile;
  const int64_t b = batch_size;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    AddLinear(absl::StrCat("fc", i), widths[i], widths[i + 1], b, &profile);
    if (i + 2 < widths.size()) {
      AddElementwise(absl::StrCat("relu", i), "relu", b * widths[i + 1], &profile);
    }
  }
  AddCrossEntropy(b, widths.back(), &profile);
  Finish(batch_size, &profile);
  return profile;
}

Profile UniformChainProfile(int layers, int64_t width, int batch_size) {
  Profile profile;
  for (int i = 0; i < layers; ++i) {
    AddLinear(absl::StrCat("fc", i), width, width, batch_size, &profile);
  }
  AddCrossEntropy(batch_size, width, &profile);
  Finish(batch_size, &profile);
  return profile;
}

Profile GptProfile(const GptShape& s) {
  Profile profile;
  const double B = s.batch_size, T = s.context, d = s.d_model, a = s.n_head, V = s.vocab;
  const double N = B * T;

  LayerProfile* embedding = AddLayer("embedding", "embedding", &profile);
  SetStateBytes(static_cast<int64_t>(V * d + T * d), embedding);
  embedding->set_forward_flops(N * d);
  embedding->set_backward_flops(N * d);
  // Gather N rows, add the position rows, write N rows; backward scatter-adds
  // into the dense V x d gradient.
  embedding->set_forward_memory_bytes(4.0 * (3 * N * d));
  embedding->set_backward_memory_bytes(4.0 * (2 * N * d + V * d));
  embedding->mutable_analytic_memory()->set_activation_bytes(static_cast<int64_t>(8 * N));
  embedding->mutable_analytic_memory()->set_output_bytes(static_cast<int64_t>(4 * N * d));

  const double block_params = 12 * d * d + 13 * d;
  const double block_activation_elements = 16 * N * d + 2 * a * B * T * T + 4 * N;
  for (int i = 0; i < s.n_layer; ++i) {
    LayerProfile* block = AddLayer(absl::StrCat("block", i), "transformer_block", &profile);
    SetStateBytes(static_cast<int64_t>(block_params), block);
    const double fwd = 24 * N * d * d + 4 * N * T * d;
    block->set_forward_flops(fwd);
    block->set_backward_flops(2 * fwd);
    block->set_forward_memory_bytes(4.0 * (block_params + 2 * block_activation_elements));
    block->set_backward_memory_bytes(8.0 * (block_params + 2 * block_activation_elements));
    tandem::v1::LayerMemory* m = block->mutable_analytic_memory();
    m->set_activation_bytes(static_cast<int64_t>(4 * block_activation_elements));
    m->set_workspace_bytes(static_cast<int64_t>(4 * 4 * N * d));
    m->set_output_bytes(static_cast<int64_t>(4 * N * d));
  }

  LayerProfile* ln = AddLayer("ln_f", "layer_norm", &profile);
  SetStateBytes(static_cast<int64_t>(2 * d), ln);
  ln->set_forward_flops(8 * N * d);
  ln->set_backward_flops(16 * N * d);
  ln->set_forward_memory_bytes(4.0 * 2 * N * d);
  ln->set_backward_memory_bytes(4.0 * 4 * N * d);
  ln->mutable_analytic_memory()->set_activation_bytes(static_cast<int64_t>(4 * (N * d + 2 * N)));
  ln->mutable_analytic_memory()->set_output_bytes(static_cast<int64_t>(4 * N * d));

  LayerProfile* head = AddLayer("lm_head", "linear", &profile);
  SetStateBytes(static_cast<int64_t>(V * d), head);
  head->set_forward_flops(2 * N * d * V);
  head->set_backward_flops(4 * N * d * V);
  head->set_forward_memory_bytes(4.0 * (V * d + N * d + N * V));
  head->set_backward_memory_bytes(8.0 * (V * d + N * d + N * V));
  head->mutable_analytic_memory()->set_activation_bytes(static_cast<int64_t>(4 * N * d));
  head->mutable_analytic_memory()->set_output_bytes(static_cast<int64_t>(4 * N * V));

  AddCrossEntropy(static_cast<int64_t>(N), s.vocab, &profile);
  Finish(s.batch_size, &profile);
  return profile;
}

}  // namespace tandem::planner::testing
