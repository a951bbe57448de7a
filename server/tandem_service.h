// The tandem.v1.Tandem gRPC service on the callback API. Each RPC checks the
// bearer token, validates its request (INVALID_ARGUMENT naming the field), and
// delegates: jobs to the JobManager, profiles to the profiler, plans to the
// planner. Work that blocks (the store's fsync, planning) runs on the service's
// own thread pool, never on gRPC's threads. Every RPC is counted and timed by
// method and status code. Thread-safe.
#ifndef TANDEM_SERVER_TANDEM_SERVICE_H_
#define TANDEM_SERVER_TANDEM_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "runtime/core/thread_pool.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/server_metrics.h"
#include "tandem/v1/tandem_service.grpc.pb.h"

namespace tandem::server {

// Answers GetNode; the daemon's main supplies it (devices, versions, features).
using NodeInfoProvider = std::function<tandem::v1::NodeInfo()>;
// Optional back ends of ProfileModel and PlanModel; UNIMPLEMENTED when unset.
using ProfileHandler = std::function<grpc::Status(const tandem::v1::ProfileModelRequest&,
                                                  tandem::v1::ProfileModelResponse*)>;
using PlanHandler = std::function<grpc::Status(const tandem::v1::PlanModelRequest&,
                                               tandem::v1::PlanModelResponse*)>;

struct ServiceOptions {
  Authenticator auth;
  NodeInfoProvider node_info;
  ProfileHandler profile;
  PlanHandler plan;
  // Threads for blocking work (store writes, profiling, planning).
  int worker_threads = 32;
};

class TandemService final : public tandem::v1::Tandem::CallbackService {
 public:
  TandemService(JobManager* jobs, ServerMetrics* metrics, ServiceOptions options);
  ~TandemService() override;

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const tandem::v1::SubmitJobRequest* request,
                                      tandem::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const tandem::v1::GetJobRequest* request,
                                   tandem::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const tandem::v1::ListJobsRequest* request,
                                     tandem::v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<tandem::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context, const tandem::v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const tandem::v1::CancelJobRequest* request,
                                      tandem::v1::Job* response) override;
  grpc::ServerUnaryReactor* ProfileModel(grpc::CallbackServerContext* context,
                                         const tandem::v1::ProfileModelRequest* request,
                                         tandem::v1::ProfileModelResponse* response) override;
  grpc::ServerUnaryReactor* PlanModel(grpc::CallbackServerContext* context,
                                      const tandem::v1::PlanModelRequest* request,
                                      tandem::v1::PlanModelResponse* response) override;
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* context,
                                    const tandem::v1::GetNodeRequest* request,
                                    tandem::v1::NodeInfo* response) override;

  // Records an RPC's outcome in the metrics.
  void Record(const char* method, absl::Time start, const grpc::Status& status);
  JobManager* jobs() { return jobs_; }
  const Authenticator& auth() const { return options_.auth; }

 private:
  // Runs `work` on the worker pool after the auth check, and finishes the
  // reactor with its status.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const char* method,
                                  std::function<grpc::Status()> work);

  JobManager* const jobs_;
  ServerMetrics* const metrics_;
  ServiceOptions options_;
  ThreadPool workers_;
};

// absl::Status to grpc::Status (same code and message).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_TANDEM_SERVICE_H_
