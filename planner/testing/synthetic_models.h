// Synthetic Profiles for the planner's tests and benchmarks. The runtime will
// export real ones; these are built from formulas (analytic) or from chosen
// numbers (measured-style), so tests can hand-compute what the planner must
// answer. Not for production code. Thread-compatible free functions.
#ifndef TANDEM_PLANNER_TESTING_SYNTHETIC_MODELS_H_
#define TANDEM_PLANNER_TESTING_SYNTHETIC_MODELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/v1/profile.pb.h"

namespace tandem::planner::testing {

// One layer with measured-style numbers, at the profile's batch size.
struct SyntheticLayer {
  std::string name;
  // In seconds.
  double accelerator_forward_seconds = 0;
  double accelerator_backward_seconds = 0;
  double accelerator_update_seconds = 0;
  double host_forward_seconds = 0;
  double host_backward_seconds = 0;
  double host_update_seconds = 0;
  // In bytes. Gradient bytes equal parameter bytes; optimizer state is twice
  // them (Adam) unless set.
  int64_t parameter_bytes = 0;
  int64_t optimizer_state_bytes = -1;
  int64_t activation_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t output_bytes = 0;
};

struct SyntheticNode {
  // Copy engines, in bytes per second and seconds per copy.
  double h2d_bytes_per_second = 1e9;
  double d2h_bytes_per_second = 1e9;
  double link_latency_seconds = 0;
  // Host threads the host update timings were measured with.
  int host_threads = 1;
  int64_t accelerator_memory_bytes = int64_t{80} << 30;
  int64_t host_memory_bytes = int64_t{1} << 40;
  // Host STREAM bandwidth (gradient averaging), in bytes per second.
  double host_memory_bytes_per_second = 100e9;
};

// A profile "measured" on a host ("cpu") and one CUDA GPU ("cuda:0") whose
// timing medians are exactly the given numbers.
tandem::v1::Profile MeasuredChainProfile(const std::vector<SyntheticLayer>& layers, int batch_size,
                                         const SyntheticNode& node = {});

// Linear(widths[i] -> widths[i+1]) + ReLU per hidden layer, a final Linear,
// cross_entropy; fp32, Adam. Analytic fields only. Per linear layer with
// n_in -> n_out at batch B:
//   parameters      = n_in*n_out + n_out
//   forward FLOPs   = 2*B*n_in*n_out, backward FLOPs = 4*B*n_in*n_out
//   forward bytes   = 4*(params + B*n_in + B*n_out), backward bytes = 2x
//   activation      = 4*B*n_in (its saved input), output = 4*B*n_out
tandem::v1::Profile MlpProfile(const std::vector<int64_t>& widths, int batch_size);

// A chain of `layers` linear layers of width `width` (no ReLU), then
// cross_entropy: the uniform chain the solve-time benchmark scales to 10,000.
tandem::v1::Profile UniformChainProfile(int layers, int64_t width, int batch_size);

struct GptShape {
  int batch_size = 8;
  int context = 1024;
  int d_model = 768;
  int n_layer = 12;
  int n_head = 12;
  int vocab = 50257;
};

// GPT-2 style, fp32, Adam, untied embedding and head: embedding (token +
// position), n_layer transformer_blocks, final layer_norm, linear head,
// cross_entropy. With N = B*T tokens, d = d_model, a = n_head, V = vocab:
//   block parameters  = 12d^2 + 13d
//   block fwd FLOPs   = 24*N*d^2 (QKV, projection, 2 MLP GEMMs) + 4*N*T*d
//                       (Q K^T and att V), backward = 2x forward
//   block activations = 4 bytes * (16*N*d + 2*a*B*T^2 + 4*N), the tensors
//                       llm.c's train_gpt2.c keeps per layer (ln1, qkv, atty,
//                       preatt, att, attproj, residual2, ln2, fch, fch_gelu,
//                       fcproj, residual3, LN statistics)
//   block bytes moved = 4*(params + 2 * activation elements) forward, 2x back
//   block workspace   = 4 bytes * 4*N*d (the MLP hidden gradient)
//   head FLOPs        = 2*N*d*V forward, 4*N*d*V backward; logits 4*N*V bytes
//   cross_entropy     = ~5*N*V FLOPs, keeps the probabilities (4*N*V bytes)
tandem::v1::Profile GptProfile(const GptShape& shape);

}  // namespace tandem::planner::testing

#endif  // TANDEM_PLANNER_TESTING_SYNTHETIC_MODELS_H_
