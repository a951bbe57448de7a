#include "server/tandem_service.h"

#include <string>

namespace tandem::server {
namespace {

// The one stub the foundation allows: an RPC whose issue has not landed yet says
// so, and which component will answer it.
grpc::ServerUnaryReactor* Unimplemented(grpc::CallbackServerContext* context,
                                        const std::string& method, const std::string& owner) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                               method + " is not implemented yet: it arrives with the " + owner));
  return reactor;
}

class UnimplementedWatch : public grpc::ServerWriteReactor<tandem::v1::JobEvent> {
 public:
  UnimplementedWatch() {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "WatchJob is not implemented yet: it arrives with the job service"));
  }
  void OnDone() override { delete this; }
};

}  // namespace

TandemService::TandemService() = default;

grpc::ServerUnaryReactor* TandemService::SubmitJob(grpc::CallbackServerContext* context,
                                                   const tandem::v1::SubmitJobRequest*,
                                                   tandem::v1::SubmitJobResponse*) {
  return Unimplemented(context, "SubmitJob", "job service");
}

grpc::ServerUnaryReactor* TandemService::GetJob(grpc::CallbackServerContext* context,
                                                const tandem::v1::GetJobRequest*,
                                                tandem::v1::Job*) {
  return Unimplemented(context, "GetJob", "job service");
}

grpc::ServerUnaryReactor* TandemService::ListJobs(grpc::CallbackServerContext* context,
                                                  const tandem::v1::ListJobsRequest*,
                                                  tandem::v1::ListJobsResponse*) {
  return Unimplemented(context, "ListJobs", "job service");
}

grpc::ServerWriteReactor<tandem::v1::JobEvent>* TandemService::WatchJob(
    grpc::CallbackServerContext*, const tandem::v1::WatchJobRequest*) {
  return new UnimplementedWatch();
}

grpc::ServerUnaryReactor* TandemService::CancelJob(grpc::CallbackServerContext* context,
                                                   const tandem::v1::CancelJobRequest*,
                                                   tandem::v1::Job*) {
  return Unimplemented(context, "CancelJob", "job service");
}

grpc::ServerUnaryReactor* TandemService::ProfileModel(grpc::CallbackServerContext* context,
                                                      const tandem::v1::ProfileModelRequest*,
                                                      tandem::v1::ProfileModelResponse*) {
  return Unimplemented(context, "ProfileModel", "profiler");
}

grpc::ServerUnaryReactor* TandemService::PlanModel(grpc::CallbackServerContext* context,
                                                   const tandem::v1::PlanModelRequest*,
                                                   tandem::v1::PlanModelResponse*) {
  return Unimplemented(context, "PlanModel", "planner");
}

grpc::ServerUnaryReactor* TandemService::GetNode(grpc::CallbackServerContext* context,
                                                 const tandem::v1::GetNodeRequest*,
                                                 tandem::v1::NodeInfo*) {
  return Unimplemented(context, "GetNode", "job service");
}

}  // namespace tandem::server
