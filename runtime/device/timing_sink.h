// What a running step shows of itself, for whoever observes it: the wall time
// of each layer's phases and every resource's spans. Runners (runtime/exec)
// report into a LayerTimingSink; the profiler's always-on histograms and the
// job telemetry (runtime/profile) are sinks. This header is the seam between
// them, so neither includes the other.
#ifndef TANDEM_RUNTIME_DEVICE_TIMING_SINK_H_
#define TANDEM_RUNTIME_DEVICE_TIMING_SINK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "tandem/v1/plan.pb.h"

namespace tandem {

enum class Phase : uint8_t { kForward = 0, kBackward = 1, kUpdate = 2 };

// One span the hybrid executor finished (span_engine.h): which resource ran
// it, for how long, what it moved, and how long the resource sat idle before
// it waiting for another resource.
struct ResourceSpan {
  tandem::v1::TimelineResource resource = tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED;
  double busy_seconds = 0;
  // Bytes moved (copies) or touched (updates).
  int64_t bytes = 0;
  double wait_seconds = 0;
  tandem::v1::TimelineResource waited_on = tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED;
};

// The spans finished since the previous batch, with the accelerator they ran
// beside ("emulated:0", "cuda:0") and the pinned host memory its copies stage
// through, in use now.
struct ResourceSpanBatch {
  std::string accelerator;
  int64_t pinned_host_bytes = 0;
  // The accelerator's memory as the batch was recorded (the end of a step):
  // in use by category, and the most in use at once since the job began.
  std::optional<MemoryStats> accelerator_memory;
  std::vector<ResourceSpan> spans;
};

// What the profiler's always-on mode observes of a running step: the wall time
// of each layer's phases (every runner), and every resource's spans (the
// hybrid executor). Called from the thread driving the runner.
class LayerTimingSink {
 public:
  virtual ~LayerTimingSink() = default;
  virtual void Record(int layer, Phase phase, double seconds) = 0;
  virtual void RecordSpans(const ResourceSpanBatch& batch) {}
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DEVICE_TIMING_SINK_H_
