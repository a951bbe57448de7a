// tandemd: wires the job store, the job manager, the gRPC service (with health
// and reflection), the metrics endpoint, and a graceful stop on SIGTERM/SIGINT.
// The work lives in the components; main only wires.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/build_info.h"
#include "base/flags_usage.h"
#include "base/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "node/placement.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cuda/device_query.h"
#include "runtime/train/profile_model.h"
#include "server/auth.h"
#include "server/cluster/peers.h"
#include "server/cluster/ranks.h"
#include "server/cluster/rendezvous.h"
#include "server/health_watchdog.h"
#include "server/job_manager.h"
#include "server/metrics/exposer.h"
#include "server/metrics/nvml_collector.h"
#include "server/model_rpcs.h"
#include "server/node_info.h"
#include "server/path_policy.h"
#include "server/server_metrics.h"
#include "server/store/job_store.h"
#include "server/tandem_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address (host:port; port 0 picks one).");
ABSL_FLAG(std::string, port_file, "",
          "Once serving and its health answers for tandem.v1.Tandem, write the bound gRPC "
          "port here (for --listen=HOST:0).");
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
ABSL_FLAG(int64_t, accelerator_memory_budget, 0,
          "Accelerator bytes all jobs together may use; 0 = 90% of the device's memory.");
ABSL_FLAG(int64_t, gpu_memory_budget, -1,
          "Deprecated: the old name of --accelerator_memory_budget, read when that is unset.");
ABSL_FLAG(int64_t, host_memory_budget, 0,
          "Host bytes all jobs together may use; 0 = 75% of physical memory, or of the "
          "container's memory limit when lower.");
ABSL_FLAG(int, max_receive_message_bytes, 16 << 20,
          "Largest request the server accepts, in bytes.");
ABSL_FLAG(int, job_threads, 0, "CPU threads per job that sets none; 0 = all cores.");
ABSL_FLAG(std::string, store_sync, "full",
          "full: fsync every store commit (acknowledged jobs survive power loss); normal: "
          "survive a crash or kill -9 of tandemd only, for disks with slow fsync.");
ABSL_FLAG(int64_t, state_min_free_bytes, 64 << 20,
          "Free space (bytes) kept on --state_dir's file system for running jobs' records: "
          "below it, submits are refused with RESOURCE_EXHAUSTED. 0 = refuse only when the "
          "store cannot write.");
ABSL_FLAG(int64_t, job_events_kept, 10000,
          "Events each job keeps in the store besides its state changes: the newest ones "
          "(older progress and log events are pruned as new ones arrive). 0 = all.");
ABSL_FLAG(absl::Duration, resume_wait, absl::Hours(24),
          "How long a job recovered at start-up whose memory cannot be estimated (its data "
          "not mounted yet, its device not visible yet) waits queued, estimated again every "
          "30 s, before it fails with the reason.");
ABSL_FLAG(bool, refresh_node_profile, false,
          "Measure the node profile (devices' GEMM and memory rates, host links, the host's "
          "memcpy and Adam rates) at start-up even when <state_dir>/node_profile.pb holds this "
          "hardware's.");
ABSL_FLAG(double, emulated_link_throttle, 0,
          "Testing closed-loop planning: the emulated accelerator's copies run at most this "
          "fast (bytes per second) and the planner is not told, standing in for a link slower "
          "than the node profile measured. 0 = none.");
ABSL_FLAG(int, emulated_accelerators, 1,
          "Emulated accelerators this node offers: a pipeline job (placement.pipeline.stages) "
          "takes one per stage, each with the job's accelerator memory. In [1, 64].");
ABSL_FLAG(bool, emulated_peer_link, true,
          "The emulated accelerators reach each other's memory over a peer link at their host "
          "link's rate: a pipeline's stages copy activations and gradients between their devices "
          "over it. false = through staging host memory (two copies), as between GPUs without "
          "peer access.");
ABSL_FLAG(int, max_running_jobs, -1,
          "Jobs that may run at once; more wait for a slot. -1 = one per CPU core, 0 = no limit.");
ABSL_FLAG(std::string, peers, "",
          "The other tandemd daemons of this one's cluster, HOST:PORT,...: distributed jobs "
          "(distributed.replicas > 1) place their ranks on them (docs/distributed.md). Without "
          "peers, a daemon with --emulated_accelerators > 1 runs a rank on each of them.");
ABSL_FLAG(std::string, peers_dns, "",
          "NAME:PORT whose address records are the peers (a Kubernetes headless Service), "
          "resolved again at every health check.");
ABSL_FLAG(std::string, advertise, "",
          "HOST:PORT at which the peers reach this daemon; default --listen (which then must "
          "name its port).");
ABSL_FLAG(std::string, peer_ca_file, "",
          "PEM roots that peers' TLS certificates are checked against; default --tls_cert.");

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

// The flags every start needs right. Negative sizes and counts are
// mistakes, not "the default" (each flag's default is spelled out: 0, or -1
// where 0 means something else).
absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_state_dir).empty()) {
    return absl::InvalidArgumentError("--state_dir is required");
  }
  if (const int k = absl::GetFlag(FLAGS_emulated_accelerators); k < 1 || k > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--emulated_accelerators must be in [1, 64], got ", k));
  }
  const std::pair<const char*, int64_t> at_least_zero[] = {
      {"accelerator_memory_budget", absl::GetFlag(FLAGS_accelerator_memory_budget)},
      {"host_memory_budget", absl::GetFlag(FLAGS_host_memory_budget)},
      {"job_threads", absl::GetFlag(FLAGS_job_threads)},
      {"state_min_free_bytes", absl::GetFlag(FLAGS_state_min_free_bytes)},
      {"job_events_kept", absl::GetFlag(FLAGS_job_events_kept)},
  };
  for (const auto& [name, value] : at_least_zero) {
    if (value < 0)
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 0, got ", value));
  }
  const std::pair<const char*, int64_t> at_least_minus_one[] = {
      {"gpu_memory_budget", absl::GetFlag(FLAGS_gpu_memory_budget)},
      {"max_running_jobs", absl::GetFlag(FLAGS_max_running_jobs)},
  };
  for (const auto& [name, value] : at_least_minus_one) {
    if (value < -1) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= -1, got ", value));
    }
  }
  if (absl::GetFlag(FLAGS_max_receive_message_bytes) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max_receive_message_bytes must be > 0, got ",
                                                   absl::GetFlag(FLAGS_max_receive_message_bytes)));
  }
  return absl::OkStatus();
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

// A bearer token from --auth_token_file, or no authentication without one.
absl::StatusOr<tandem::server::Authenticator> AuthenticatorFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_auth_token_file);
  if (path.empty()) return tandem::server::Authenticator();
  return tandem::server::Authenticator::FromFile(path);
}

// The job store under `state_dir`, with --store_sync's durability.
absl::StatusOr<std::unique_ptr<tandem::server::JobStore>> OpenStore(const std::string& state_dir) {
  using tandem::server::JobStore;
  std::error_code ec;
  std::filesystem::create_directories(state_dir + "/jobs", ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state_dir '", state_dir, "': ", ec.message()));
  }
  const std::string sync = absl::GetFlag(FLAGS_store_sync);
  if (sync != "full" && sync != "normal") {
    return absl::InvalidArgumentError("--store_sync must be full or normal");
  }
  return JobStore::Open(state_dir + "/jobs.db",
                        sync == "full" ? JobStore::Sync::kFull : JobStore::Sync::kNormal);
}

// --accelerator_memory_budget, or its deprecated old name when only that is set.
int64_t AcceleratorMemoryBudgetFlag() {
  const int64_t old_name = absl::GetFlag(FLAGS_gpu_memory_budget);
  if (old_name < 0) return absl::GetFlag(FLAGS_accelerator_memory_budget);
  std::fprintf(stderr,
               "tandemd: --gpu_memory_budget is deprecated; use --accelerator_memory_budget\n");
  return absl::GetFlag(FLAGS_accelerator_memory_budget) > 0
             ? absl::GetFlag(FLAGS_accelerator_memory_budget)
             : old_name;
}

// How the node profile is measured, from the flags.
tandem::server::NodeOfferSettings NodeOfferSettingsFromFlags(
    const std::string& state_dir, const tandem::node::NodeResources& resources) {
  return {.state_dir = state_dir,
          .threads = absl::GetFlag(FLAGS_job_threads),
          .accelerator_budget_bytes = AcceleratorMemoryBudgetFlag(),
          .cuda_devices = resources.cuda_devices,
          .emulated_link_throttle_bytes_per_second = absl::GetFlag(FLAGS_emulated_link_throttle),
          .emulated_accelerators = absl::GetFlag(FLAGS_emulated_accelerators),
          .emulated_peer_link = absl::GetFlag(FLAGS_emulated_peer_link)};
}

// The node as the planner sees it, from the node profile: measured now (a few
// seconds) or read from <state_dir>/node_profile.pb when that holds this
// hardware's. When measuring fails, the host's quick GEMM and triad figures.
tandem::node::NodeOffer NodeOfferOfThisNode(const std::string& state_dir,
                                            const tandem::node::NodeResources& resources) {
  const tandem::server::NodeOfferSettings settings =
      NodeOfferSettingsFromFlags(state_dir, resources);
  absl::StatusOr<tandem::node::NodeOffer> offer = tandem::server::MeasureNodeOffer(
      settings, absl::GetFlag(FLAGS_refresh_node_profile), "measured at start-up");
  if (offer.ok()) return *std::move(offer);
  std::fprintf(stderr,
               "tandemd: node profile: measuring failed (%s); planning from quick host figures\n",
               offer.status().ToString().c_str());
  tandem::node::NodeOffer quick =
      tandem::node::DetectNodeOffer(settings.accelerator_budget_bytes, resources.cuda_devices);
  tandem::server::ApplyEmulatedSettings(settings, &quick);
  return quick;
}

// The budgets and limits of the flags, each flag's default derived from the
// node (75% of host memory, 90% of the GPU's, a running slot per core). The
// host's GEMM and triad rates are measured now (about half a second): the
// planner plans hybrid jobs with them.
tandem::server::JobManagerOptions JobManagerOptionsFromFlags(
    const std::string& state_dir, const tandem::server::PathPolicy& policy,
    const tandem::node::NodeResources& resources) {
  tandem::server::JobManagerOptions o{.state_dir = state_dir, .data_policy = policy};
  o.host_memory_budget_bytes =
      tandem::node::HostMemoryBudget(absl::GetFlag(FLAGS_host_memory_budget), resources);
  o.has_accelerator = !resources.cuda_devices.empty();
  o.default_threads = absl::GetFlag(FLAGS_job_threads);
  o.node = NodeOfferOfThisNode(state_dir, resources);
  o.accelerator_memory_budget_bytes = o.node->accelerator_memory_budget_bytes;
  std::fprintf(stderr, "tandemd: planning with %s%s\n", o.node->host.name().c_str(),
               o.has_accelerator ? absl::StrCat(" and ", resources.cuda_devices[0].name).c_str()
                                 : "; no CUDA device (jobs may use the emulated accelerator)");
  const int running = absl::GetFlag(FLAGS_max_running_jobs);
  o.max_running_jobs = running >= 0 ? running : std::max(1, resources.cpu_threads);
  o.state_min_free_bytes = absl::GetFlag(FLAGS_state_min_free_bytes);
  o.events_kept_per_job = absl::GetFlag(FLAGS_job_events_kept);
  o.resume_wait = absl::GetFlag(FLAGS_resume_wait);
  return o;
}

// The peers of --peers/--peers_dns, called with the token and TLS of
// --auth_token_file and --tls_cert. Without either flag, a node of several
// emulated accelerators is a cluster of its own (its distributed jobs run a
// rank per accelerator, docs/distributed.md) where it has a port to be
// reached at; else null.
absl::StatusOr<std::unique_ptr<tandem::server::PeerSet>> PeersFromFlags() {
  using namespace tandem::server;
  const std::string list = absl::GetFlag(FLAGS_peers), dns = absl::GetFlag(FLAGS_peers_dns);
  PeerSetOptions o;
  o.self = absl::GetFlag(FLAGS_advertise).empty() ? absl::GetFlag(FLAGS_listen)
                                                  : absl::GetFlag(FLAGS_advertise);
  if (list.empty() && dns.empty() &&
      (absl::GetFlag(FLAGS_emulated_accelerators) <= 1 || absl::EndsWith(o.self, ":0"))) {
    return nullptr;
  }
  TANDEM_ASSIGN_OR_RETURN(o.static_peers, ParsePeerList(list));
  if (!dns.empty() && dns.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError("--peers_dns: must be NAME:PORT");
  }
  o.dns = dns;
  if (absl::EndsWith(o.self, ":0")) {
    return absl::InvalidArgumentError(
        "--advertise: peers need this daemon's port; set --advertise=HOST:PORT (or a --listen "
        "port other than 0)");
  }
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    o.credentials.token =
        std::string(absl::StripAsciiWhitespace(ReadFile(absl::GetFlag(FLAGS_auth_token_file))));
  }
  if (absl::GetFlag(FLAGS_tls_cert).empty()) {
    o.credentials.channel = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    const bool ca = !absl::GetFlag(FLAGS_peer_ca_file).empty();
    const std::string roots =
        ca ? absl::GetFlag(FLAGS_peer_ca_file) : absl::GetFlag(FLAGS_tls_cert);
    ssl.pem_root_certs = ReadFile(roots);
    // Empty roots would make gRPC trust the system's: never a silent default.
    if (ssl.pem_root_certs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(ca ? "--peer_ca_file" : "--tls_cert",
                                                     ": cannot read '", roots,
                                                     "' (the peers' TLS roots)"));
    }
    o.credentials.channel = grpc::SslCredentials(ssl);
  }
  return std::make_unique<PeerSet>(std::move(o));
}

// Distributed jobs are admitted and run through `coordinator` (null: no
// --peers, and such jobs are refused).
void CoordinateDistributedJobs(tandem::server::Coordinator* coordinator,
                               tandem::server::JobManagerOptions& options) {
  if (coordinator == nullptr) return;
  options.admit_distributed = [coordinator](const tandem::v1::JobSpec& resolved) {
    return coordinator->Admit(resolved);
  };
  options.begin_distributed = [coordinator](const tandem::v1::Job& job,
                                            const std::string& checkpoint_dir) {
    return coordinator->Begin(job, checkpoint_dir);
  };
}

// The peers' health checks start once this daemon serves.
void StartPeers(tandem::server::PeerSet* peers) {
  if (peers == nullptr) return;
  peers->Start();
  std::fprintf(stderr, "tandemd: cluster of %zu peers, reached as %s\n", peers->Snapshot().size(),
               peers->self().c_str());
}

// GetNode answers the peers' health and this daemon's advertised address too.
void AddPeersToNodeInfo(tandem::server::PeerSet* peers, tandem::server::ServiceOptions& options) {
  if (peers == nullptr) return;
  options.node_info = [base = options.node_info, peers] {
    tandem::v1::NodeInfo node = base();
    for (tandem::v1::PeerInfo& p : peers->Snapshot()) *node.add_peers() = std::move(p);
    node.set_advertise_address(peers->self());
    return node;
  };
}

// What the service needs beyond the job manager: authentication, the node's
// description, and the PlanModel/ProfileModel work. `jobs` and `policy` must
// outlive it.
tandem::server::ServiceOptions ServiceOptionsFor(const tandem::server::Authenticator& auth,
                                                 const tandem::node::NodeResources& resources,
                                                 tandem::server::JobManager& jobs,
                                                 const std::string& state_dir,
                                                 const tandem::server::PathPolicy& policy) {
  using namespace tandem::server;
  const google::protobuf::Timestamp start_time = google::protobuf::util::TimeUtil::GetCurrentTime();
  const tandem::PathResolver resolve = [&policy](const std::string& field,
                                                 const std::string& path) {
    return policy.Resolve(field, path);
  };
  ServiceOptions o;
  o.auth = auth;
  o.node_info = [&resources, &jobs, start_time] {
    return BuildNodeInfo(resources, jobs, start_time);
  };
  o.plan = MakePlanHandler(resolve, &jobs);
  o.refresh_node = MakeNodeRefresher(NodeOfferSettingsFromFlags(state_dir, resources), &jobs);
  o.profile =
      MakeProfileHandler(state_dir + "/profiles", resolve, absl::GetFlag(FLAGS_job_threads), &jobs);
  return o;
}

// TLS from --tls_cert/--tls_key, or plaintext when neither is set.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CredentialsFromFlags() {
  if (absl::GetFlag(FLAGS_tls_cert).empty() && absl::GetFlag(FLAGS_tls_key).empty()) {
    return grpc::InsecureServerCredentials();
  }
  const std::string cert = ReadFile(absl::GetFlag(FLAGS_tls_cert));
  const std::string key = ReadFile(absl::GetFlag(FLAGS_tls_key));
  if (cert.empty() || key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must both name readable PEM files");
  }
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

// /metrics on --metrics_listen (null when it is empty), its port written.
absl::StatusOr<std::unique_ptr<tandem::metrics::MetricsExposer>> StartMetrics(
    const std::vector<std::shared_ptr<prometheus::Collectable>>& sources) {
  const std::string address = absl::GetFlag(FLAGS_metrics_listen);
  if (address.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<tandem::metrics::MetricsExposer>> exposer =
      tandem::metrics::MetricsExposer::Start(address, {sources.begin(), sources.end()});
  if (!exposer.ok()) return exposer.status();
  if (!WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), (*exposer)->port())) {
    return absl::InternalError(absl::StrCat("--metrics_port_file: cannot write '",
                                            absl::GetFlag(FLAGS_metrics_port_file), "'"));
  }
  std::fprintf(stderr, "tandemd: metrics on http://%s/metrics (port %d)\n", address.c_str(),
               (*exposer)->port());
  return exposer;
}

// Drops the server reflection plugin (which the reflection library registers
// for every builder when it loads) from one builder.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return absl::StrContains(p->name(), "reflection");
                                  }),
                   plugins->end());
  }
};

// The gRPC server with the service, health and (without a token) reflection,
// listening on --listen, its port in `*bound`. The port file is the caller's to write,
// once the daemon answers health checks as it should.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(grpc::Service* service,
                                                        grpc::Service* cluster, int* bound) {
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                          CredentialsFromFlags());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Reflection cannot check the bearer token: with one required it is off
  // (clients with the token have the .proto files in proto/).
  const bool reflection = absl::GetFlag(FLAGS_auth_token_file).empty();
  if (!reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  // A port another process listens on is refused, not shared: with gRPC's
  // default SO_REUSEPORT a second tandemd on the same port would start and
  // take part of the first one's connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), credentials, &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_receive_message_bytes));
  builder.RegisterService(service);
  if (cluster != nullptr) builder.RegisterService(cluster);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen)));
  }
  *bound = port;
  std::fprintf(stderr, "tandemd %s: serving gRPC on %s (port %d)%s%s\n",
               tandem::VersionString().c_str(), absl::GetFlag(FLAGS_listen).c_str(), port,
               absl::GetFlag(FLAGS_tls_cert).empty() ? "" : ", TLS",
               reflection ? "" : "; server reflection off (it cannot check the token)");
  return server;
}

}  // namespace

// This daemon's part in a cluster (none without --peers): the ranks it runs
// for other daemons' jobs and the service between daemons; the coordinator
// (if any) plans its jobs' ranks on the JobManager's node offer.
struct ClusterRole {
  std::unique_ptr<tandem::server::RankHost> ranks;
  std::unique_ptr<tandem::server::ClusterService> service;
};
ClusterRole JoinCluster(tandem::server::PeerSet* peers, tandem::server::Coordinator* coordinator,
                        tandem::server::JobManager& jobs, const tandem::server::Authenticator& auth,
                        tandem::server::RendezvousTable* rendezvous, const std::string& state_dir,
                        tandem::server::ServerMetrics* metrics) {
  ClusterRole role;
  if (coordinator != nullptr) coordinator->set_node_source([&jobs] { return jobs.node(); });
  if (peers == nullptr) return role;
  role.ranks = std::make_unique<tandem::server::RankHost>(&jobs, peers, state_dir, metrics);
  role.service =
      std::make_unique<tandem::server::ClusterService>(auth, role.ranks.get(), rendezvous);
  return role;
}

namespace {

// grpc.health.v1 kept true by probing `jobs` through its lock. GetNode does
// not take that lock (a peer's health check must not wait on a store write),
// so a stuck probe is told to the job manager, whose GetNode figures then say
// it is not accepting.
std::unique_ptr<tandem::server::HealthWatchdog> WatchHealth(
    tandem::server::JobManager& jobs, grpc::HealthCheckServiceInterface* health) {
  return std::make_unique<tandem::server::HealthWatchdog>(
      [&jobs] { return jobs.ProbeNotAccepting(); },
      [health, &jobs](const std::string& service, bool serving) {
        health->SetServingStatus(service, serving);
        if (service.empty()) {
          jobs.SetUnresponsive(serving ? ""
                                       : "tandemd's job manager has not answered for seconds "
                                         "(a store write stuck on a slow or failing disk?)");
        }
      });
}

// Waits for SIGTERM or SIGINT, then drains: health says NOT_SERVING; no new
// jobs; running jobs checkpoint and re-queue; watch streams end; in-flight
// RPCs get up to 10 s.
void DrainOnSignal(const sigset_t& shutdown_signals,
                   std::unique_ptr<tandem::server::HealthWatchdog> watchdog,
                   grpc::HealthCheckServiceInterface* health, ClusterRole& role,
                   tandem::server::JobManager& jobs, grpc::Server& server) {
  int signal_number = 0;
  sigwait(&shutdown_signals, &signal_number);
  std::fprintf(stderr, "tandemd: %s received: draining\n", strsignal(signal_number));
  watchdog.reset();
  health->SetServingStatus(false);
  if (role.ranks != nullptr) role.ranks->StopAll("tandemd is stopping");
  jobs.Shutdown();
  server.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server.Wait();
  role.ranks.reset();
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

  if (const absl::Status flags = CheckFlags(); !flags.ok()) {
    return Fail(std::string(flags.message()));
  }
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  absl::StatusOr<PathPolicy> policy = PathPolicy::Create(absl::GetFlag(FLAGS_data_root));
  if (!policy.ok()) return Fail(std::string(policy.status().message()));
  absl::StatusOr<Authenticator> auth = AuthenticatorFromFlags();
  if (!auth.ok()) return Fail(std::string(auth.status().message()));
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenStore(state_dir);
  if (!store.ok()) return Fail(std::string(store.status().message()));
  if (!(*store)->read_only().ok()) {
    std::fprintf(stderr, "tandemd: %s; serving what is stored and accepting no jobs\n",
                 std::string((*store)->read_only().message()).c_str());
  }

  const NodeResources resources = tandem::node::DetectNodeResources();
  ServerMetrics metrics;
  absl::StatusOr<std::unique_ptr<PeerSet>> peers = PeersFromFlags();
  if (!peers.ok()) return Fail(std::string(peers.status().message()));
  RendezvousTable rendezvous;
  std::unique_ptr<Coordinator> coordinator =
      *peers != nullptr ? std::make_unique<Coordinator>(peers->get(), &rendezvous) : nullptr;
  JobManagerOptions options = JobManagerOptionsFromFlags(state_dir, *policy, resources);
  CoordinateDistributedJobs(coordinator.get(), options);
  JobManager jobs(options, store->get(), &metrics);
  ClusterRole role =
      JoinCluster(peers->get(), coordinator.get(), jobs, *auth, &rendezvous, state_dir, &metrics);
  if (absl::Status s = jobs.Recover(); !s.ok())
    return Fail(absl::StrCat("recovery: ", s.ToString()));

  ServiceOptions service_options = ServiceOptionsFor(*auth, resources, jobs, state_dir, *policy);
  AddPeersToNodeInfo(peers->get(), service_options);
  TandemService service(&jobs, &metrics, std::move(service_options));

  const std::vector<std::shared_ptr<prometheus::Collectable>> sources =
      MetricsSources(metrics, jobs, absl::GetFlag(FLAGS_nvml_library));
  absl::StatusOr<std::unique_ptr<tandem::metrics::MetricsExposer>> exposer = StartMetrics(sources);
  int port = 0;
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      exposer.ok() ? StartGrpc(&service, role.service.get(), &port) : exposer.status();
  if (!server.ok()) {
    jobs.Shutdown();
    return Fail(std::string(server.status().message()));
  }
  // Health answers for tandem.v1.Tandem from the watchdog's first probe on;
  // the port file, which clients and tests wait for, is written after it (a
  // check right after start-up found "service name unknown").
  grpc::HealthCheckServiceInterface* health = (*server)->GetHealthCheckService();
  std::unique_ptr<HealthWatchdog> watchdog = WatchHealth(jobs, health);
  if (!WritePortFile(absl::GetFlag(FLAGS_port_file), port)) {
    watchdog.reset();
    jobs.Shutdown();
    (*server)->Shutdown();
    return Fail(absl::StrCat("--port_file: cannot write '", absl::GetFlag(FLAGS_port_file), "'"));
  }
  // Jobs start once the daemon serves: one that cannot listen (its port
  // taken) or write its port file exits without having started, and
  // stopped, its recovered jobs.
  jobs.Start();
  StartPeers(peers->get());
  std::fprintf(stderr, "tandemd: state in %s, data under %s%s\n", state_dir.c_str(),
               policy->root().c_str(), auth->enabled() ? ", token auth" : "");

  DrainOnSignal(shutdown_signals, std::move(watchdog), health, role, jobs, **server);
  std::fprintf(stderr, "tandemd: shutting down cleanly\n");
  return 0;
}
