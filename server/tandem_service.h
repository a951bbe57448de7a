// The tandem.v1.Tandem gRPC service on the callback API. Each RPC checks the
// bearer token, validates its request (INVALID_ARGUMENT naming the field), and
// delegates: jobs to the JobManager, profiles to the profiler, plans to the
// planner. Work that blocks runs on the service's threads, never on gRPC's:
// the cheap RPCs' (the store's fsync) on one pool, profiles (and GetNode's
// node-profile refresh) and plans each on a bounded lane of their own, so that
// they never hold a thread GetNode or SubmitJob needs. Every RPC is counted and timed by
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
#include "server/work_lane.h"
#include "tandem/v1/tandem_service.grpc.pb.h"

namespace tandem::server {

// Answers GetNode; the daemon's main supplies it (devices, versions, features).
using NodeInfoProvider = std::function<tandem::v1::NodeInfo()>;
// True once the caller has gone (cancelled, or its deadline passed): work
// that checks it stops early, its answer unwanted.
using StopCheck = std::function<bool()>;
// Optional back ends of ProfileModel and PlanModel; UNIMPLEMENTED when unset.
using ProfileHandler = std::function<grpc::Status(
    const tandem::v1::ProfileModelRequest&, tandem::v1::ProfileModelResponse*, const StopCheck&)>;
using PlanHandler = std::function<grpc::Status(const tandem::v1::PlanModelRequest&,
                                               tandem::v1::PlanModelResponse*, const StopCheck&)>;
// GetNode's refresh_profile: measures the node profile again; UNIMPLEMENTED
// when unset.
using NodeRefresher = std::function<grpc::Status(const StopCheck&)>;

struct ServiceOptions {
  Authenticator auth;
  NodeInfoProvider node_info;
  ProfileHandler profile;
  PlanHandler plan;
  NodeRefresher refresh_node;
  // Threads for the cheap RPCs' blocking work (the store's fsync).
  int worker_threads = 32;
  // The expensive RPCs' own lanes (work_lane.h): a profile measures the whole
  // node, so one runs at a time (the profile handler relies on this lane for
  // that); plans run two at a time.
  WorkLaneOptions profile_lane{
      .name = "profile", .threads = 1, .max_queued = 4, .max_per_client = 2};
  WorkLaneOptions plan_lane{.name = "plan", .threads = 2, .max_queued = 8, .max_per_client = 4};
};

// The service's base: every method that takes a request parses it itself (raw
// callback methods, wire_request.h), so a request that does not parse is
// INVALID_ARGUMENT naming the field.
using TandemServiceBase = tandem::v1::Tandem::WithRawCallbackMethod_SubmitJob<
    tandem::v1::Tandem::WithRawCallbackMethod_GetJob<
        tandem::v1::Tandem::WithRawCallbackMethod_ListJobs<
            tandem::v1::Tandem::WithRawCallbackMethod_WatchJob<
                tandem::v1::Tandem::WithRawCallbackMethod_CancelJob<
                    tandem::v1::Tandem::WithRawCallbackMethod_ProfileModel<
                        tandem::v1::Tandem::WithRawCallbackMethod_PlanModel<
                            tandem::v1::Tandem::WithRawCallbackMethod_GetNode<
                                tandem::v1::Tandem::Service>>>>>>>>;

class TandemService final : public TandemServiceBase {
 public:
  TandemService(JobManager* jobs, ServerMetrics* metrics, ServiceOptions options);
  ~TandemService() override;

  // Each parses a tandem.v1 request and answers its response message (named
  // after the method in tandem_service.proto).
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchJob(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ProfileModel(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PlanModel(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  // With refresh_profile, on the profile lane: the node is measured again
  // first (ServiceOptions::refresh_node).
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

  // Records an RPC's outcome in the metrics.
  void Record(const char* method, absl::Time start, const grpc::Status& status);
  JobManager* jobs() { return jobs_; }
  const Authenticator& auth() const { return options_.auth; }

 private:
  // Runs `work` on the worker pool after the auth check, and finishes the
  // reactor with its status; DEADLINE_EXCEEDED or CANCELLED without running
  // it when the caller went away while it waited.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const char* method,
                                  std::function<grpc::Status()> work);
  // The same on `lane`, which may refuse it (RESOURCE_EXHAUSTED at once);
  // `work` gets the caller's StopCheck.
  grpc::ServerUnaryReactor* OnLane(grpc::CallbackServerContext* context, const char* method,
                                   WorkLane& lane,
                                   std::function<grpc::Status(const StopCheck&)> work);
  // Both end here: the caller's absence, or else `work`, gives the status,
  // which is recorded and finishes the reactor.
  void RunAndFinish(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor,
                    const char* method, absl::Time start,
                    const std::function<grpc::Status()>& work);

  // ListJobs on a parsed request.
  grpc::Status List(const tandem::v1::ListJobsRequest& request,
                    tandem::v1::ListJobsResponse* response);

  JobManager* const jobs_;
  ServerMetrics* const metrics_;
  ServiceOptions options_;
  ThreadPool workers_;
  WorkLane profile_lane_;
  WorkLane plan_lane_;
};

// absl::Status to grpc::Status (same code and message).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_TANDEM_SERVICE_H_
