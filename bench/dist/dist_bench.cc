// Scale-out on one machine: N rank processes on loopback, joined through
// Gloo's file store in a temporary directory.
//  1. Gloo all-reduce bandwidth (algorithm bytes per second: the buffer's size
//     over the time) for 1 to 64 MiB on 2 and 4 ranks, next to a memcpy of
//     the same size measured in the same run.
//  2. Step time of the gpt bench model on 1, 2 and 4 data-parallel ranks at
//     the same global batch, replicated and ZeRO-partitioned, with the
//     seconds the step waited on communication after its backward.
// All ranks share this machine's cores: on 2 cores, 2 and 4 ranks divide them,
// so the step times say what communication costs, not how training scales.
// Figures are medians of timed repetitions after a warm-up.
#include <fcntl.h>
#include <omp.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "gloo/rendezvous/file_store.h"
#include "runtime/core/allocator.h"
#include "runtime/core/clock.h"
#include "runtime/cpu/onednn.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/dist/data_parallel_runner.h"
#include "runtime/train/job_model.h"
#include "spec/job_spec.h"

ABSL_FLAG(int, rank, -1, "Internal: this process's rank (-1: the launcher).");
ABSL_FLAG(int, ranks, 0, "Internal: the rank count.");
ABSL_FLAG(std::string, store, "", "Internal: the file store's directory.");
ABSL_FLAG(std::string, mode, "", "Internal: allreduce | replicated | partitioned.");
ABSL_FLAG(int, threads, 0, "OpenMP threads per rank; 0 = cores / ranks.");
ABSL_FLAG(int, steps, 12, "Timed training steps per configuration (after 3 warm-up).");

extern char** environ;

namespace tandem {
namespace {

// The gpt of the throughput bench at a global batch of 32 sequences.
const char kGpt[] = R"(
model: {gpt: {n_layer: 4, n_head: 4, d_model: 256, context: 64}}
data: {synthetic: {sample_shape: [64], num_classes: 96, tokens: true, train_samples: 4096}}
optimizer: {kind: OPTIMIZER_KIND_ADAMW, learning_rate: 0.0003}
training: {batch_size: 32, steps: 100, seed: 1}
)";

double Median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Cores() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

// Rank side of part 1: prints "bytes seconds" per size (rank 0).
int AllReduceRank(Communicator& comm) {
  for (int64_t mib : {1, 4, 16, 64}) {
    const int64_t n = mib * (1 << 20) / 4;
    std::vector<float> x(n, 1.0f);
    std::vector<double> t;
    for (int i = 0; i < 8; ++i) {
      const double start = WallSeconds();
      if (!comm.AllReduceSum(x.data(), n).ok()) return 1;
      if (i > 0) t.push_back(WallSeconds() - start);
    }
    if (comm.rank() == 0) std::printf("allreduce %ld %.6f\n", long(n * 4), Median(t));
  }
  return 0;
}

// Rank side of part 2: prints "step seconds exposed" (rank 0).
int TrainRank(Communicator& comm, OptimizerSharding sharding) {
  const tandem::v1::JobSpec spec = *ResolveJobSpec(*ParseJobSpec(kGpt, "bench.yaml"), false);
  JobModel jm = *BuildJobModel(spec, nullptr, DType::kF32);
  HostAllocator host;
  DataParallelOptions options;
  options.sharding = sharding;
  auto runner =
      DataParallelRunner::Create(*jm.model, spec.optimizer(), spec.training().batch_size(),
                                 spec.training().seed(), &host, &comm, options);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().ToString().c_str());
    return 1;
  }
  const Datasets data = *OpenDatasets(spec.data(), 1, nullptr, ModelContext(spec));
  BatchLoader loader(*data.train, spec.training().batch_size(), true, 1, false);
  std::vector<double> steps, exposed;
  const int timed = absl::GetFlag(FLAGS_steps);
  for (int s = 0; s < timed + 3; ++s) {
    StepOptions so;
    so.step = s;
    so.learning_rate = 3e-4f;
    const Batch& batch = loader.Next();
    const double start = WallSeconds();
    auto r = (*runner)->TrainStep(batch, so);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      return 1;
    }
    if (s >= 3) {
      steps.push_back(WallSeconds() - start);
      exposed.push_back((*runner)->stats().step_exposed_seconds +
                        (*runner)->stats().step_other_seconds);
    }
  }
  if (comm.rank() == 0) {
    std::printf("train %.6f %.6f %d %ld\n", Median(steps), Median(exposed),
                (*runner)->stats().buckets, long((*runner)->optimizer_elements()));
  }
  return 0;
}

int RankMain() {
  const int threads = absl::GetFlag(FLAGS_threads);
  omp_set_num_threads(threads);
  gloo::rendezvous::FileStore store(absl::GetFlag(FLAGS_store));
  CommunicatorOptions options;
  options.timeout = absl::Seconds(120);
  auto comm = Communicator::Connect(store, absl::GetFlag(FLAGS_mode), absl::GetFlag(FLAGS_rank),
                                    absl::GetFlag(FLAGS_ranks), options);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "allreduce") return AllReduceRank(**comm);
  return TrainRank(**comm, mode == "partitioned" ? OptimizerSharding::kPartitioned
                                                 : OptimizerSharding::kReplicated);
}

// Runs `ranks` copies of this program in `mode`; returns rank 0's output lines.
std::vector<std::string> Launch(int ranks, const std::string& mode) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("tandem-dist-bench-", getpid()))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/rank0.out";
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = std::max(1, Cores() / ranks);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> args = {"/proc/self/exe",
                                     absl::StrCat("--rank=", r),
                                     absl::StrCat("--ranks=", ranks),
                                     "--store=" + dir,
                                     "--mode=" + mode,
                                     absl::StrCat("--threads=", threads),
                                     absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps))};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (r == 0) {
      posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ) != 0) {
      std::perror("posix_spawn");
      std::exit(1);
    }
    posix_spawn_file_actions_destroy(&actions);
    pids.push_back(pid);
  }
  bool failed = false;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  if (failed) {
    std::fprintf(stderr, "a rank of %d in mode %s failed\n", ranks, mode.c_str());
    std::exit(1);
  }
  std::vector<std::string> lines;
  FILE* f = std::fopen(out.c_str(), "r");
  char line[512];
  while (f != nullptr && std::fgets(line, sizeof(line), f)) lines.push_back(line);
  if (f != nullptr) std::fclose(f);
  std::filesystem::remove_all(dir);
  return lines;
}

double MemcpySeconds(int64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> t;
  for (int i = 0; i < 8; ++i) {
    const double start = WallSeconds();
    std::memcpy(b.data(), a.data(), bytes);
    if (i > 0) t.push_back(WallSeconds() - start);
  }
  if (b[bytes / 2] != 1) std::abort();
  return Median(t);
}

std::string CpuModel() {
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  char line[512];
  std::string model = "unknown";
  while (f != nullptr && std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "model name", 10) == 0) {
      model = std::strchr(line, ':') + 2;
      model.pop_back();
      break;
    }
  }
  if (f != nullptr) std::fclose(f);
  return model;
}

int LauncherMain() {
  std::printf("CPU: %s, %d cores; oneDNN %s, ISA %s; Gloo TCP on 127.0.0.1\n", CpuModel().c_str(),
              Cores(), cpu::OneDnnVersion().c_str(), cpu::OneDnnIsa().c_str());
  std::printf(
      "\nAll-reduce (sum, fp32), one process per rank; memcpy of the same size in the "
      "same run\n");
  std::printf("%8s %6s %12s %14s %14s %8s\n", "MiB", "ranks", "all-reduce", "GB/s (algo)",
              "memcpy GB/s", "ratio");
  for (int ranks : {2, 4}) {
    for (const std::string& line : Launch(ranks, "allreduce")) {
      long bytes = 0;
      double seconds = 0;
      if (std::sscanf(line.c_str(), "allreduce %ld %lf", &bytes, &seconds) != 2) continue;
      const double copy = MemcpySeconds(bytes);
      std::printf("%8ld %6d %10.2f ms %14.2f %14.2f %8.3f\n", bytes >> 20, ranks, seconds * 1e3,
                  bytes / seconds / 1e9, bytes / copy / 1e9, copy / seconds);
    }
  }
  std::printf(
      "\nData-parallel gpt (4 layers, d_model 256, context 64), global batch 32, "
      "%d cores shared by all ranks\n",
      Cores());
  std::printf("%6s %12s %10s %12s %9s %14s %12s\n", "ranks", "sharding", "step", "comm waited",
              "buckets", "Adam floats", "vs 1 rank");
  double one = 0;
  for (int ranks : {1, 2, 4}) {
    for (const char* mode : {"replicated", "partitioned"}) {
      if (ranks == 1 && std::string(mode) == "partitioned") continue;
      for (const std::string& line : Launch(ranks, mode)) {
        double step = 0, exposed = 0;
        int buckets = 0;
        long owned = 0;
        if (std::sscanf(line.c_str(), "train %lf %lf %d %ld", &step, &exposed, &buckets, &owned) !=
            4) {
          continue;
        }
        if (ranks == 1) one = step;
        std::printf("%6d %12s %7.1f ms %9.1f ms %9d %14ld %11.2fx\n", ranks, mode, step * 1e3,
                    exposed * 1e3, buckets, owned, one / step);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_rank) >= 0) return tandem::RankMain();
  return tandem::LauncherMain();
}
