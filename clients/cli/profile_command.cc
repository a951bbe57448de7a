// `tandem profile FILE`: profiles a job file's model layer by layer on this
// machine's CPU and GPU (when one is found and opens), in this process (no
// daemon), through the same entry point as the ProfileModel RPC, and prints the
// report (or the Profile as JSON).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "clients/cli/commands.h"
#include "runtime/profile/node_devices.h"
#include "runtime/profile/profile_report.h"
#include "runtime/train/profile_model.h"
#include "spec/job_spec.h"

ABSL_DECLARE_FLAG(int, threads);
ABSL_FLAG(int, iterations, 10, "tandem profile: timed calls per phase, in [1, 1000].");
ABSL_FLAG(int, warmup, 3,
          "tandem profile: untimed calls per phase before timing, in [1, 100] (0 means the "
          "default, 3).");
ABSL_FLAG(bool, refresh, false,
          "tandem profile: measure again even when a profile is cached; tandem node: the daemon "
          "measures its node profile again (refused while jobs run).");
ABSL_FLAG(std::string, trace_out, "",
          "tandem profile, status, train: also write one measured iteration as Chrome trace JSON "
          "to this file (open it in ui.perfetto.dev or chrome://tracing); status and train write "
          "the plan's predicted iteration beside it, as FILE.predicted.json.");
ABSL_FLAG(std::string, profile_cache, "",
          "tandem profile: directory of cached profiles; empty = $XDG_CACHE_HOME/tandem/profiles "
          "or ~/.cache/tandem/profiles; 'none' = no cache.");

namespace tandem::cli {
namespace {

// The 1-minute load average, or 0 when unknown.
double LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double load = 0;
  return f >> load ? load : 0;
}

std::string CacheDir() {
  const std::string flag = absl::GetFlag(FLAGS_profile_cache);
  if (flag == "none") return "";
  if (!flag.empty()) return flag;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/tandem/profiles");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/tandem/profiles");
  }
  return "";
}

}  // namespace

absl::StatusOr<int> RunProfile(const Args& args) {
  if (args.size() != 1) return UsageError("usage: tandem profile FILE");
  absl::StatusOr<tandem::v1::JobSpec> spec = LoadJobSpecFile(args[0]);
  if (!spec.ok()) return spec.status();

  // The API reads 0 as "the default"; on the command line it is a mistake.
  if (absl::GetFlag(FLAGS_iterations) < 1) {
    return UsageError(
        absl::StrCat("--iterations: must be in [1, 1000], got ", absl::GetFlag(FLAGS_iterations)));
  }
  tandem::v1::ProfileModelRequest request;
  *request.mutable_spec() = *spec;
  request.set_iterations(absl::GetFlag(FLAGS_iterations));
  request.set_warmup_iterations(absl::GetFlag(FLAGS_warmup));
  request.set_refresh(absl::GetFlag(FLAGS_refresh));
  const std::string trace_out = absl::GetFlag(FLAGS_trace_out);
  request.set_include_trace(!trace_out.empty());

  profile::ProfilerEnvironment env;
  env.cache_dir = CacheDir();
  env.threads =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : spec->training().threads();
  // Progress on a terminal only, redrawn in place, so stdout stays the report.
  const bool tty = ::isatty(::fileno(stderr)) != 0;
  if (tty) {
    env.on_progress = [](const std::string& line) {
      std::fprintf(stderr, "\r\033[Kprofiling %s", line.c_str());
      std::fflush(stderr);
    };
  }
  // The host, and the GPU when one is found and opens; why not, when it does not.
  const profile::NodeProfiledDevices node = profile::OpenNodeProfiledDevices(env.threads, env.cpu);
  for (const std::string& note : node.notes) {
    std::fprintf(stderr, "tandem profile: %s\n", note.c_str());
  }
  env.devices = node.devices();

  const double load_before = LoadAverage();
  absl::StatusOr<profile::ProfileResult> result = profile::ProfileModel(request, env);
  if (tty) std::fprintf(stderr, "\r\033[K");
  if (!result.ok()) return result.status();
  const double load = std::max(load_before, LoadAverage());
  const unsigned cpus = std::thread::hardware_concurrency();
  if (!result->cached && cpus > 0 && load > cpus) {
    std::fprintf(stderr,
                 "tandem profile: the load average was %.1f on %u CPUs while measuring: the "
                 "timings include time spent waiting for other processes\n",
                 load, cpus);
  }

  if (!trace_out.empty()) {
    std::ofstream f(trace_out);
    f << result->chrome_trace_json;
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write trace to '", trace_out, "'"));
  }
  if (GetGlobals().json()) {
    std::printf("%s\n", ToJson(result->profile).c_str());
  } else {
    std::printf("%s",
                profile::FormatProfileReport(result->profile, {.cached = result->cached}).c_str());
    if (!trace_out.empty()) {
      std::printf("\ntrace: %s (one iteration; open in ui.perfetto.dev or chrome://tracing)\n",
                  trace_out.c_str());
    }
  }
  return 0;
}

}  // namespace tandem::cli
