// The tandem.v1.Tandem gRPC service, on the callback API. Each RPC validates its
// request, then delegates to the component that owns the work; this class only
// translates between protos, absl::Status and grpc::Status. Thread-safe: handlers
// run concurrently on gRPC's threads.
#ifndef TANDEM_SERVER_TANDEM_SERVICE_H_
#define TANDEM_SERVER_TANDEM_SERVICE_H_

#include "tandem/v1/tandem_service.grpc.pb.h"

namespace tandem::server {

class TandemService final : public tandem::v1::Tandem::CallbackService {
 public:
  TandemService();

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
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_TANDEM_SERVICE_H_
