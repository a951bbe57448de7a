#include "server/tandem_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/wire_request.h"

namespace tandem::server {
namespace {

using tandem::v1::JobEvent;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// Job ids are "job-" and digits; anything else cannot name a job.
grpc::Status CheckJobId(const std::string& id, const char* field) {
  if (id.empty()) return Invalid(absl::StrCat(field, ": is required"));
  if (id.size() > 64 || JobStore::SequenceOf(id) <= 0) {
    return Invalid(absl::StrCat(field, ": '", id.substr(0, 64), "' is not a job id (job-NNNNNN)"));
  }
  return grpc::Status::OK;
}

// Streams a job's events: the backlog from `from_sequence` (memory or store),
// then live ones as they are appended. One write in flight at a time; the log
// never waits for this watcher.
class WatchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchReactor(TandemService* service, grpc::CallbackServerContext* context,
               const grpc::ByteBuffer* raw_request)
      : service_(service), start_(absl::Now()), shared_(std::make_shared<Shared>()) {
    shared_->reactor = this;
    tandem::v1::WatchJobRequest request;
    grpc::Status status = service->auth().Check(*context);
    if (status.ok()) status = ParseRequest(*raw_request, &request);
    if (status.ok()) status = CheckJobId(request.job_id(), "job_id");
    if (status.ok()) {
      absl::StatusOr<std::shared_ptr<EventLog>> log = service->jobs()->Events(request.job_id());
      if (log.ok()) {
        log_ = *log;
      } else {
        status = ToGrpc(log.status());
      }
    }
    if (!status.ok()) {
      FinishOnce(status);
      return;
    }
    job_id_ = request.job_id();
    cursor_ = std::max<uint64_t>(1, request.from_sequence());
    follow_ = !request.has_follow() || request.follow();
    absl::MutexLock lock(&shared_->mu);
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&shared_->mu);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
      return;
    }
    cursor_ = buffer_.front().sequence() + 1;
    buffer_.pop_front();
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&shared_->mu);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&shared_->mu);
      if (log_ && wait_handle_ != 0) log_->CancelWait(wait_handle_);
      shared_->reactor = nullptr;
    }
    delete this;
  }

 private:
  // What the log's wake-up callback holds: it outlives the reactor.
  struct Shared {
    absl::Mutex mu;
    WatchReactor* reactor = nullptr;
  };

  void FinishOnce(const grpc::Status& status) {
    finished_ = true;
    service_->Record("WatchJob", start_, status);
    Finish(status);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu) {
    if (finished_) return;
    if (wait_handle_ != 0) {
      log_->CancelWait(wait_handle_);
      wait_handle_ = 0;
    }
    FinishOnce(status);
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu) {
    while (!finished_ && !writing_) {
      // Seen before reading: every event of a log closed by now is in what
      // Refill reads, so the last one (the job's end) is sent before the end.
      const bool closed = log_->closed();
      if (buffer_.empty()) {
        if (const absl::Status s = Refill(); !s.ok()) {
          FinishLocked(
              grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat("cannot read the job's stored events (", s.message(),
                                        "); watch again from sequence ", cursor_)));
          return;
        }
      }
      if (!buffer_.empty()) {
        writing_ = true;
        SerializeResponse(buffer_.front(), &out_);
        StartWrite(&out_);
        return;
      }
      if (closed) {
        if (log_->shutting_down()) {
          FinishLocked(grpc::Status(
              grpc::StatusCode::UNAVAILABLE,
              absl::StrCat("tandemd is shutting down; watch again from sequence ", cursor_)));
        } else {
          FinishLocked(grpc::Status::OK);
        }
        return;
      }
      if (!follow_) {
        FinishLocked(grpc::Status::OK);
        return;
      }
      std::shared_ptr<Shared> shared = shared_;
      wait_handle_ = log_->WaitFor(cursor_, [shared] {
        absl::MutexLock lock(&shared->mu);
        if (shared->reactor != nullptr) {
          shared->reactor->wait_handle_ = 0;
          shared->reactor->PumpLocked();
        }
      });
      if (wait_handle_ != 0) return;  // Woken later; otherwise read again.
    }
  }

  // The next events from the cursor: below what memory holds, from the store
  // and the events not written yet (the persister's batch, or those a full
  // disk holds back), in order. A store that cannot be read is an error
  // (never a skip past its events).
  absl::Status Refill() {
    uint64_t first_in_memory = 0;
    std::vector<JobEvent> events = log_->Read(cursor_, 64, &first_in_memory);
    if (cursor_ < first_in_memory) {
      const int want = static_cast<int>(std::min<uint64_t>(64, first_in_memory - cursor_));
      TANDEM_ASSIGN_OR_RETURN(std::vector<JobEvent> below, Below(first_in_memory, want));
      if (!below.empty()) {
        events = std::move(below);
      } else {
        // Nothing below memory anywhere (events lost in a crash): skip ahead.
        cursor_ = first_in_memory;
        events = log_->Read(cursor_, 64, &first_in_memory);
      }
    }
    for (JobEvent& e : events) buffer_.push_back(std::move(e));
    return absl::OkStatus();
  }

  // The first `want` events from the cursor below `first_in_memory`: the
  // store's merged with those not written yet (a state change the store
  // took directly can sit past step events still waiting), each once.
  absl::StatusOr<std::vector<JobEvent>> Below(uint64_t first_in_memory, int want) {
    // The unstored first: an event leaves them only once the store has it.
    std::vector<JobEvent> below =
        service_->jobs()->UnstoredEvents(job_id_, cursor_, first_in_memory, want);
    TANDEM_ASSIGN_OR_RETURN(std::vector<JobEvent> stored,
                            service_->jobs()->store()->ReadEvents(job_id_, cursor_, want));
    // Memory serves from first_in_memory on (the store may hold a later state
    // change past events it never got).
    for (JobEvent& e : stored) {
      if (e.sequence() < first_in_memory) below.push_back(std::move(e));
    }
    std::sort(below.begin(), below.end(),
              [](const JobEvent& a, const JobEvent& b) { return a.sequence() < b.sequence(); });
    below.erase(std::unique(below.begin(), below.end(),
                            [](const JobEvent& a, const JobEvent& b) {
                              return a.sequence() == b.sequence();
                            }),
                below.end());
    if (below.size() > static_cast<size_t>(want)) below.resize(want);
    return below;
  }

  TandemService* const service_;
  const absl::Time start_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<EventLog> log_;
  std::string job_id_;
  uint64_t cursor_ = 1;
  bool follow_ = true;
  bool writing_ = false;
  bool finished_ = false;
  int64_t wait_handle_ = 0;
  std::deque<JobEvent> buffer_;
  // buffer_.front() serialized, while it is written.
  grpc::ByteBuffer out_;
};

// The work of a method on its parsed request: a closure for Unary or OnLane
// that parses `raw_request` (INVALID_ARGUMENT naming the field when it does
// not parse), runs `work(request, &response, extra...)` (OnLane passes the
// StopCheck) and serializes the response into `raw_response`.
template <typename Request, typename Response, typename Work>
auto Parsed(const grpc::ByteBuffer* raw_request, grpc::ByteBuffer* raw_response, Work work) {
  return [raw_request, raw_response, work](const auto&... extra) -> grpc::Status {
    Request request;
    grpc::Status status = ParseRequest(*raw_request, &request);
    if (!status.ok()) return status;
    Response response;
    status = work(request, &response, extra...);
    if (status.ok()) SerializeResponse(response, raw_response);
    return status;
  };
}

// The status for a request whose caller went away while it waited, nothing
// done; nullopt while the caller still waits.
// A passed deadline is asked first: gRPC also marks such a call cancelled, and
// the caller must read DEADLINE_EXCEEDED, whichever status reaches it first.
std::optional<grpc::Status> CallerGone(grpc::CallbackServerContext& context, const char* method) {
  if (std::chrono::system_clock::now() > context.deadline()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat(method, ": the deadline passed before it started"));
  }
  if (context.IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        absl::StrCat(method, ": cancelled by the client before it started"));
  }
  return std::nullopt;
}

// `lane` reporting its requests in flight to tandem_rpc_lane_requests.
WorkLaneOptions WithGauge(WorkLaneOptions lane, ServerMetrics* metrics) {
  prometheus::Gauge& gauge = metrics->rpc_lane_requests.Add({{"lane", lane.name}});
  gauge.Set(0);
  lane.on_in_flight = [&gauge](int in_flight) { gauge.Set(in_flight); };
  return lane;
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

TandemService::TandemService(JobManager* jobs, ServerMetrics* metrics, ServiceOptions options)
    : jobs_(jobs),
      metrics_(metrics),
      options_(std::move(options)),
      workers_(options_.worker_threads, "rpc"),
      profile_lane_(WithGauge(options_.profile_lane, metrics)),
      plan_lane_(WithGauge(options_.plan_lane, metrics)) {}

TandemService::~TandemService() = default;

void TandemService::Record(const char* method, absl::Time start, const grpc::Status& status) {
  const char* code = CodeName(status.error_code());
  metrics_->rpc_requests.Add({{"method", method}, {"code", code}}).Increment();
  metrics_->rpc_duration.Add({{"method", method}, {"code", code}}, metrics_->rpc_duration_buckets)
      .Observe(absl::ToDoubleSeconds(absl::Now() - start));
}

grpc::ServerUnaryReactor* TandemService::Unary(grpc::CallbackServerContext* context,
                                               const char* method,
                                               std::function<grpc::Status()> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  const grpc::Status auth = options_.auth.Check(*context);
  if (!auth.ok()) {
    Record(method, start, auth);
    reactor->Finish(auth);
    return reactor;
  }
  workers_.Schedule([this, context, reactor, method, start, work = std::move(work)] {
    RunAndFinish(context, reactor, method, start, work);
  });
  return reactor;
}

void TandemService::RunAndFinish(grpc::CallbackServerContext* context,
                                 grpc::ServerUnaryReactor* reactor, const char* method,
                                 absl::Time start, const std::function<grpc::Status()>& work) {
  const std::optional<grpc::Status> gone = CallerGone(*context, method);
  grpc::Status status = gone ? *gone : work();
  // Work its stop check ended says CANCELLED; past the deadline that is the
  // deadline's doing.
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      std::chrono::system_clock::now() > context->deadline()) {
    status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat(method, ": the deadline passed: ", status.error_message()));
  }
  Record(method, start, status);
  reactor->Finish(status);
}

grpc::ServerUnaryReactor* TandemService::OnLane(
    grpc::CallbackServerContext* context, const char* method, WorkLane& lane,
    std::function<grpc::Status(const StopCheck&)> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  grpc::Status status = options_.auth.Check(*context);
  if (status.ok()) {
    status = ToGrpc(lane.Submit(PeerClient(context->peer()), [this, context, reactor, method, start,
                                                              work = std::move(work)] {
      const StopCheck stop = [context, method] { return CallerGone(*context, method).has_value(); };
      RunAndFinish(context, reactor, method, start, [&] { return work(stop); });
    }));
    if (status.ok()) return reactor;
  }
  Record(method, start, status);
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* TandemService::SubmitJob(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw_request,
                                                   grpc::ByteBuffer* raw_response) {
  return Unary(
      context, "SubmitJob",
      Parsed<tandem::v1::SubmitJobRequest, tandem::v1::SubmitJobResponse>(
          raw_request, raw_response, [this](const auto& request, auto* response) -> grpc::Status {
            if (!request.has_spec()) return Invalid("spec: is required");
            absl::StatusOr<JobManager::Submitted> submitted =
                jobs_->Submit(request.spec(), request.request_id());
            if (!submitted.ok()) return ToGrpc(submitted.status());
            *response->mutable_job() = submitted->job;
            response->set_created(submitted->created);
            return grpc::Status::OK;
          }));
}

grpc::ServerUnaryReactor* TandemService::GetJob(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* raw_request,
                                                grpc::ByteBuffer* raw_response) {
  return Unary(
      context, "GetJob",
      Parsed<tandem::v1::GetJobRequest, tandem::v1::Job>(
          raw_request, raw_response, [this](const auto& request, auto* response) -> grpc::Status {
            grpc::Status s = CheckJobId(request.job_id(), "job_id");
            if (!s.ok()) return s;
            absl::StatusOr<tandem::v1::Job> job = jobs_->Get(request.job_id());
            if (!job.ok()) return ToGrpc(job.status());
            *response = *job;
            return grpc::Status::OK;
          }));
}

grpc::ServerUnaryReactor* TandemService::ListJobs(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* raw_request,
                                                  grpc::ByteBuffer* raw_response) {
  return Unary(context, "ListJobs",
               Parsed<tandem::v1::ListJobsRequest, tandem::v1::ListJobsResponse>(
                   raw_request, raw_response, [this](const auto& request, auto* response) {
                     return List(request, response);
                   }));
}

grpc::Status TandemService::List(const tandem::v1::ListJobsRequest& request,
                                 tandem::v1::ListJobsResponse* response) {
  JobFilter filter;
  if (request.page_size() < 0 || request.page_size() > 1000) {
    return Invalid(absl::StrCat("page_size: must be in [0, 1000], got ", request.page_size()));
  }
  filter.limit = request.page_size() == 0 ? 100 : request.page_size();
  for (int i = 0; i < request.states_size(); ++i) {
    const int s = request.states(i);
    if (!tandem::v1::JobState_IsValid(s) || s == tandem::v1::JOB_STATE_UNSPECIFIED) {
      return Invalid(absl::StrCat("states[", i, "]: unknown job state ", s));
    }
    filter.states.push_back(static_cast<tandem::v1::JobState>(s));
  }
  for (const auto& [k, v] : request.labels()) filter.labels[k] = v;
  if (!request.page_token().empty()) {
    int64_t before = 0;
    if (request.page_token().size() > 24 || request.page_token()[0] != 'p' ||
        !absl::SimpleAtoi(request.page_token().substr(1), &before) || before <= 0) {
      return Invalid("page_token: not a token from ListJobsResponse.next_page_token");
    }
    filter.before_sequence = before;
  }
  absl::StatusOr<JobPage> page = jobs_->List(filter);
  if (!page.ok()) return ToGrpc(page.status());
  for (auto& job : page->jobs) {
    // A page of programs and plans could outgrow a message; GetJob has them.
    job.clear_schedule();
    for (auto& record : *job.mutable_plan_history()) record.clear_plan();
    *response->add_jobs() = std::move(job);
  }
  if (page->next_before > 0) response->set_next_page_token(absl::StrCat("p", page->next_before));
  response->set_total_size(page->total);
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TandemService::WatchJob(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new WatchReactor(this, context, request);
}

grpc::ServerUnaryReactor* TandemService::CancelJob(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw_request,
                                                   grpc::ByteBuffer* raw_response) {
  return Unary(
      context, "CancelJob",
      Parsed<tandem::v1::CancelJobRequest, tandem::v1::Job>(
          raw_request, raw_response, [this](const auto& request, auto* response) -> grpc::Status {
            grpc::Status s = CheckJobId(request.job_id(), "job_id");
            if (!s.ok()) return s;
            absl::StatusOr<tandem::v1::Job> job = jobs_->Cancel(request.job_id(), request.reason());
            if (!job.ok()) return ToGrpc(job.status());
            *response = *job;
            return grpc::Status::OK;
          }));
}

grpc::ServerUnaryReactor* TandemService::ProfileModel(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* raw_request,
                                                      grpc::ByteBuffer* raw_response) {
  if (!options_.profile) {
    return Unary(context, "ProfileModel", [] {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "ProfileModel is not implemented yet: it arrives with the profiler");
    });
  }
  return OnLane(context, "ProfileModel", profile_lane_,
                Parsed<tandem::v1::ProfileModelRequest, tandem::v1::ProfileModelResponse>(
                    raw_request, raw_response, options_.profile));
}

grpc::ServerUnaryReactor* TandemService::PlanModel(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw_request,
                                                   grpc::ByteBuffer* raw_response) {
  if (!options_.plan) {
    return Unary(context, "PlanModel", [] {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "PlanModel is not implemented yet: it arrives with the planner");
    });
  }
  return OnLane(context, "PlanModel", plan_lane_,
                Parsed<tandem::v1::PlanModelRequest, tandem::v1::PlanModelResponse>(
                    raw_request, raw_response, options_.plan));
}

grpc::ServerUnaryReactor* TandemService::GetNode(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* raw_request,
                                                 grpc::ByteBuffer* raw_response) {
  // Parsed once, here: whether the node is measured again decides the lane.
  tandem::v1::GetNodeRequest request;
  const grpc::Status parsed = ParseRequest(*raw_request, &request);
  const bool refresh = parsed.ok() && request.refresh_profile();
  auto work = [this, parsed, refresh, raw_response](const StopCheck& stop) -> grpc::Status {
    if (!parsed.ok()) return parsed;
    if (refresh) {
      if (!options_.refresh_node) {
        return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                            "refresh_profile: this daemon does not measure its node");
      }
      if (grpc::Status s = options_.refresh_node(stop); !s.ok()) return s;
    }
    SerializeResponse(options_.node_info(), raw_response);
    return grpc::Status::OK;
  };
  // Measuring the node is a profile's work: on the profile lane.
  if (refresh && options_.refresh_node) return OnLane(context, "GetNode", profile_lane_, work);
  return Unary(context, "GetNode", [work] { return work(StopCheck()); });
}

}  // namespace tandem::server
