// A bounded lane for the service's expensive RPCs (ProfileModel, PlanModel):
// its own threads, so that a slow profile or a huge plan never holds a thread
// that GetNode, SubmitJob or GetJob need, a bound on the requests waiting, and
// a bound per client (its address, without the port) on those it has queued
// or running, so one client cannot fill the lane. A request over either bound
// is refused at once with RESOURCE_EXHAUSTED saying which, instead of waiting
// past its deadline. Thread-safe.
#ifndef TANDEM_SERVER_WORK_LANE_H_
#define TANDEM_SERVER_WORK_LANE_H_

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/core/thread_pool.h"

namespace tandem::server {

struct WorkLaneOptions {
  // Named in errors and thread names ("profile", "plan").
  std::string name;
  // Requests run at once.
  int threads = 1;
  // Requests waiting for a thread, beyond those running.
  int max_queued = 8;
  // Requests one client may have queued or running together.
  int max_per_client = 2;
  // Told the lane's requests accepted and not yet finished (queued or
  // running) each time that changes, under the lane's lock: for a gauge.
  std::function<void(int in_flight)> on_in_flight;
};

class WorkLane {
 public:
  explicit WorkLane(WorkLaneOptions options);
  // Runs the tasks already accepted, then joins.
  ~WorkLane();

  // Queues `task` for `client`, or refuses it (RESOURCE_EXHAUSTED, the task
  // is not run) when the lane's queue or the client's share is full.
  absl::Status Submit(const std::string& client, std::function<void()> task);

  // Accepted and not yet finished (queued or running), all clients.
  int in_flight() const;

 private:
  void Done(const std::string& client);

  const WorkLaneOptions options_;
  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> per_client_ ABSL_GUARDED_BY(mu_);
  ThreadPool pool_;  // last: its destructor runs queued tasks, which call Done
};

// The client part of a gRPC peer string: "ipv4:10.0.0.7:53122" -> "ipv4:10.0.0.7",
// "ipv6:[::1]:4000" -> "ipv6:[::1]"; anything else unchanged.
std::string PeerClient(const std::string& peer);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_WORK_LANE_H_
