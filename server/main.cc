// tandemd: wires the job store, the job manager, the gRPC service (with health
// and reflection), the metrics endpoint, and a graceful stop on SIGTERM/SIGINT.
// The work lives in the components; main only wires.
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "runtime/base/build_info.h"
#include "runtime/base/flags_usage.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cuda/device_query.h"
#include "runtime/profile/node_devices.h"
#include "runtime/profile/profile_model.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/metrics/exposer.h"
#include "server/metrics/nvml_collector.h"
#include "server/node_info.h"
#include "server/path_policy.h"
#include "server/placement.h"
#include "server/server_metrics.h"
#include "server/store/job_store.h"
#include "server/tandem_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address (host:port; port 0 picks one).");
ABSL_FLAG(std::string, port_file, "",
          "Once serving, write the bound gRPC port here (for --listen=HOST:0).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus metrics listen address (host:port); empty disables.");
ABSL_FLAG(std::string, metrics_port_file, "", "Once serving, write the bound metrics port here.");
ABSL_FLAG(std::string, nvml_library, tandem::metrics::kNvmlLibrary,
          "NVML library for the GPU gauges (tandem_gpu_*); empty disables them.");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for the job store and checkpoints (required; created if missing).");
ABSL_FLAG(std::string, data_root, "/usr/share/datasets",
          "Jobs may only read datasets under this directory.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token every RPC but health must present; empty = no auth.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for TLS; empty = plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for TLS (with --tls_cert).");
ABSL_FLAG(int64_t, gpu_memory_budget, 0,
          "Accelerator bytes all jobs together may use; 0 = 90% of the device's memory.");
ABSL_FLAG(int64_t, host_memory_budget, 0,
          "Host bytes all jobs together may use; 0 = 75% of physical memory, or of the "
          "container's memory limit when lower.");
ABSL_FLAG(int, max_receive_message_bytes, 16 << 20,
          "Largest request the server accepts, in bytes.");
ABSL_FLAG(int, job_threads, 0, "CPU threads per job that sets none; 0 = all cores.");
ABSL_FLAG(std::string, store_sync, "full",
          "full: fsync every store commit (acknowledged jobs survive power loss); normal: "
          "survive a crash or kill -9 of tandemd only, for disks with slow fsync.");
ABSL_FLAG(int, max_running_jobs, -1,
          "Jobs that may run at once; more wait for a slot. -1 = one per CPU core, 0 = no limit.");

namespace {

// Blocks SIGTERM/SIGINT in every thread (the ones started later inherit the
// mask) and returns the set, to be waited on by main alone.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

bool WritePortFile(const std::string& path, int port) {
  if (path.empty()) return true;
  // A temporary name and a rename, so a reader never sees half a number.
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "tandemd: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::InstallFlagsUsage(
      "trains neural networks on this node's CPU and GPU together.\n"
      "Serves tandem.v1.Tandem over gRPC, grpc.health.v1 and server reflection, and\n"
      "Prometheus metrics over HTTP.\n"
      "Usage: tandemd --state_dir=DIR [--listen=HOST:PORT] [--data_root=DIR] ...");
  absl::ParseCommandLine(argc, argv);
  const sigset_t shutdown_signals = BlockShutdownSignals();
  using namespace tandem::server;

  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) return Fail("--state_dir is required");
  std::error_code ec;
  std::filesystem::create_directories(state_dir + "/jobs", ec);
  if (ec) return Fail(absl::StrCat("--state_dir '", state_dir, "': ", ec.message()));

  absl::StatusOr<PathPolicy> data_policy = PathPolicy::Create(absl::GetFlag(FLAGS_data_root));
  if (!data_policy.ok()) return Fail(std::string(data_policy.status().message()));
  Authenticator auth;
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!a.ok()) return Fail(std::string(a.status().message()));
    auth = *a;
  }
  const std::string sync = absl::GetFlag(FLAGS_store_sync);
  if (sync != "full" && sync != "normal") return Fail("--store_sync must be full or normal");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(
      state_dir + "/jobs.db", sync == "full" ? JobStore::Sync::kFull : JobStore::Sync::kNormal);
  if (!store.ok()) return Fail(std::string(store.status().message()));

  const NodeResources resources = DetectNodeResources();
  ServerMetrics metrics;

  JobManagerOptions jm_options{.state_dir = state_dir, .data_policy = *data_policy};
  jm_options.host_memory_budget_bytes = absl::GetFlag(FLAGS_host_memory_budget) > 0
                                            ? absl::GetFlag(FLAGS_host_memory_budget)
                                            : resources.host_memory_bytes * 3 / 4;
  jm_options.has_accelerator = !resources.cuda_devices.empty();
  jm_options.accelerator_memory_budget_bytes =
      absl::GetFlag(FLAGS_gpu_memory_budget) > 0
          ? absl::GetFlag(FLAGS_gpu_memory_budget)
          : (resources.cuda_devices.empty() ? 0 : resources.cuda_devices[0].memory_bytes * 9 / 10);
  jm_options.default_threads = absl::GetFlag(FLAGS_job_threads);
  // The host's GEMM and triad rates, measured once now (about half a second),
  // are what the planner plans hybrid jobs with.
  jm_options.node = DetectNodeOffer(absl::GetFlag(FLAGS_gpu_memory_budget));
  std::fprintf(stderr, "tandemd: planning with %s%s\n", jm_options.node->host.name().c_str(),
               resources.cuda_devices.empty()
                   ? "; no CUDA device (jobs may use the emulated accelerator)"
                   : absl::StrCat(" and ", resources.cuda_devices[0].name).c_str());
  jm_options.max_running_jobs = absl::GetFlag(FLAGS_max_running_jobs) >= 0
                                    ? absl::GetFlag(FLAGS_max_running_jobs)
                                    : std::max(1, resources.cpu_threads);
  JobManager jobs(jm_options, store->get(), &metrics);
  if (absl::Status s = jobs.Recover(); !s.ok())
    return Fail(absl::StrCat("recovery: ", s.ToString()));
  jobs.Start();

  const google::protobuf::Timestamp start_time = google::protobuf::util::TimeUtil::GetCurrentTime();
  ServiceOptions service_options;
  service_options.auth = auth;
  service_options.node_info = [&] { return BuildNodeInfo(resources, jobs, start_time); };
  const PathPolicy& policy = *data_policy;
  const tandem::PathResolver resolve = [&policy](const std::string& field,
                                                 const std::string& path) {
    return policy.Resolve(field, path);
  };
  service_options.plan = [&](const tandem::v1::PlanModelRequest& request,
                             tandem::v1::PlanModelResponse* response) {
    absl::StatusOr<tandem::v1::PlanModelResponse> answer =
        PlanModel(request, *jm_options.node, resolve);
    if (!answer.ok()) return ToGrpc(answer.status());
    *response = *std::move(answer);
    return grpc::Status::OK;
  };
  // Profiles are measured one at a time (concurrent ones would measure each
  // other) and cached under the state directory, on the host and the GPU. The
  // devices are opened for each call, so that between profiles the GPU holds
  // no profiler context or memory and no CUPTI tracing is left running.
  absl::Mutex profile_mu;
  service_options.profile = [&](const tandem::v1::ProfileModelRequest& request,
                                tandem::v1::ProfileModelResponse* response) {
    tandem::profile::ProfilerEnvironment env;
    env.cache_dir = state_dir + "/profiles";
    env.resolve_path = resolve;
    env.threads = absl::GetFlag(FLAGS_job_threads);
    absl::MutexLock lock(&profile_mu);
    const tandem::profile::NodeProfiledDevices node =
        tandem::profile::OpenNodeProfiledDevices(env.threads, env.cpu);
    for (const std::string& note : node.notes) {
      std::fprintf(stderr, "tandemd: profile: %s\n", note.c_str());
    }
    env.devices = node.devices();
    absl::StatusOr<tandem::profile::ProfileResult> result =
        tandem::profile::ProfileModel(request, env);
    if (!result.ok()) return ToGrpc(result.status());
    *response->mutable_profile() = std::move(result->profile);
    response->set_cached(result->cached);
    response->set_chrome_trace_json(std::move(result->chrome_trace_json));
    return grpc::Status::OK;
  };
  TandemService service(&jobs, &metrics, service_options);

  std::unique_ptr<tandem::metrics::MetricsExposer> exposer;
  std::vector<std::shared_ptr<prometheus::Collectable>> scraped;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    scraped = MetricsSources(metrics, jobs, absl::GetFlag(FLAGS_nvml_library));
    absl::StatusOr<std::unique_ptr<tandem::metrics::MetricsExposer>> started =
        tandem::metrics::MetricsExposer::Start(absl::GetFlag(FLAGS_metrics_listen),
                                               {scraped.begin(), scraped.end()});
    if (!started.ok()) return Fail(std::string(started.status().message()));
    exposer = *std::move(started);
    WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), exposer->port());
    std::fprintf(stderr, "tandemd: metrics on http://%s/metrics (port %d)\n",
                 absl::GetFlag(FLAGS_metrics_listen).c_str(), exposer->port());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!absl::GetFlag(FLAGS_tls_cert).empty() || !absl::GetFlag(FLAGS_tls_key).empty()) {
    const std::string cert = ReadFile(absl::GetFlag(FLAGS_tls_cert));
    const std::string key = ReadFile(absl::GetFlag(FLAGS_tls_key));
    if (cert.empty() || key.empty())
      return Fail("--tls_cert and --tls_key must both name readable PEM files");
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    credentials = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_receive_message_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    jobs.Shutdown();
    return Fail(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen)));
  }
  std::fprintf(stderr, "tandemd %s: serving gRPC on %s (port %d), state in %s, data under %s%s%s\n",
               tandem::VersionString().c_str(), absl::GetFlag(FLAGS_listen).c_str(), bound_port,
               state_dir.c_str(), data_policy->root().c_str(), auth.enabled() ? ", token auth" : "",
               absl::GetFlag(FLAGS_tls_cert).empty() ? "" : ", TLS");
  WritePortFile(absl::GetFlag(FLAGS_port_file), bound_port);

  int signal_number = 0;
  sigwait(&shutdown_signals, &signal_number);
  std::fprintf(stderr, "tandemd: %s received: draining\n", strsignal(signal_number));
  // Health says NOT_SERVING; no new jobs; running jobs checkpoint and re-queue;
  // watch streams end; in-flight RPCs get up to 10 s.
  server->GetHealthCheckService()->SetServingStatus(false);
  jobs.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server->Wait();
  exposer.reset();
  std::fprintf(stderr, "tandemd: shutting down cleanly\n");
  return 0;
}
