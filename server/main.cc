// tandemd: wires the gRPC service, health and reflection, and shuts down cleanly
// on SIGTERM or SIGINT. The work lives in the components; main only wires.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "runtime/base/build_info.h"
#include "runtime/base/flags_usage.h"
#include "server/tandem_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address (host:port).");
ABSL_FLAG(std::string, port_file, "",
          "Once serving, write the bound gRPC port here (for --listen=HOST:0).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus metrics listen address (host:port); empty disables.");
ABSL_FLAG(std::string, state_dir, "", "Directory for the job store and checkpoints.");
ABSL_FLAG(std::string, data_root, "/usr/share/datasets",
          "Jobs may only read datasets under this directory.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token every RPC but health must present; empty = no auth.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for TLS; empty = plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for TLS.");
ABSL_FLAG(int64_t, gpu_memory_budget, 0,
          "Accelerator bytes all jobs together may use; 0 = 90% of the device's memory.");
ABSL_FLAG(int64_t, host_memory_budget, 0,
          "Host bytes all jobs together may use; 0 = 75% of physical memory.");

namespace {

// Blocks SIGTERM/SIGINT in every thread (gRPC's included, since they inherit the
// mask) and returns the set, to be waited on by main alone.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::InstallFlagsUsage(
      "trains neural networks on this node's CPU and GPU together.\n"
      "Serves tandem.v1.Tandem over gRPC, grpc.health.v1 and server reflection.\n"
      "Usage: tandemd [--listen=HOST:PORT] [--state_dir=DIR] [--data_root=DIR] ...");
  absl::ParseCommandLine(argc, argv);
  const sigset_t shutdown_signals = BlockShutdownSignals();

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  tandem::server::TandemService service;
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    std::fprintf(stderr, "tandemd: cannot listen on %s\n", absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  std::fprintf(stderr, "tandemd %s: serving gRPC on %s (port %d)\n",
               tandem::VersionString().c_str(), absl::GetFlag(FLAGS_listen).c_str(), bound_port);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    // Written to a temporary name and renamed, so a reader never sees half a number.
    const std::string tmp = port_file + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%d\n", bound_port);
      std::fclose(f);
      std::rename(tmp.c_str(), port_file.c_str());
    }
  }

  int signal_number = 0;
  sigwait(&shutdown_signals, &signal_number);
  std::fprintf(stderr, "tandemd: %s received, shutting down\n", strsignal(signal_number));
  server->GetHealthCheckService()->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server->Wait();
  std::fprintf(stderr, "tandemd: stopped\n");
  return 0;
}
