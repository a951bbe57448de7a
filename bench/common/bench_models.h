// The models and batches the CPU benchmarks train (bench/cpu_training,
// bench/profiler), as job specs: the same as bench/cpu_training/torch_peer.py's
// PyTorch peers.
#ifndef TANDEM_BENCH_COMMON_BENCH_MODELS_H_
#define TANDEM_BENCH_COMMON_BENCH_MODELS_H_

namespace tandem::bench {

struct BenchModel {
  const char* name;
  // A JobSpec in YAML.
  const char* yaml;
};

inline constexpr BenchModel kBenchModels[] = {
    {"mlp", R"(
model: {mlp: {}}
data: {synthetic: {sample_shape: [28, 28, 1], num_classes: 10}}
training: {batch_size: 128, steps: 1})"},
    {"cnn", R"(
model: {cnn: {}}
data: {synthetic: {sample_shape: [28, 28, 1], num_classes: 10}}
training: {batch_size: 128, steps: 1})"},
    {"gpt", R"(
model: {gpt: {n_layer: 4, n_head: 4, d_model: 256, context: 128}}
data: {synthetic: {sample_shape: [128], num_classes: 256, tokens: true}}
training: {batch_size: 16, steps: 1})"},
};

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_COMMON_BENCH_MODELS_H_
