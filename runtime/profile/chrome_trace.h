// An iteration's Timeline (plan.proto: measured by the profiler or the
// executor, or predicted by the planner's simulator) as Chrome trace JSON, the
// format Perfetto (ui.perfetto.dev) and chrome://tracing open:
//
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
//
// with a complete event ("ph": "X"; ts and dur in microseconds) per span, a
// counter event ("ph": "C") per memory sample, and metadata events ("ph": "M")
// naming the tracks. One process per device (pid 1: the host, pid 2: the
// accelerator) and one thread per stream or worker within it:
//
//   host:        tid 1+lane   "compute" (HOST_COMPUTE, lane = CPU worker)
//                tid 101+lane "update worker <lane>" (HOST_UPDATE)
//   accelerator: tid 1+lane   "compute stream" (ACCELERATOR_COMPUTE)
//                tid 51       "copy H2D"
//                tid 52       "copy D2H"
// A pipeline (docs/pipeline.md) puts stage k's spans on lane k of the
// accelerator's resources: "compute stream k", and its copies on tids
// 301+2k ("copy H2D k") and 302+2k ("copy D2H k") for k > 0.
//
// Only tracks that carry a span are named. Stateless; thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_CHROME_TRACE_H_
#define TANDEM_RUNTIME_PROFILE_CHROME_TRACE_H_

#include <string>
#include <vector>

#include "tandem/v1/plan.pb.h"

namespace tandem::profile {

struct ChromeTraceOptions {
  // Layer names by chain index, for event names ("conv2d0 forward"); "layer 3"
  // when missing. Layer -1 is the whole-model optimizer step ("optimizer").
  std::vector<std::string> layer_names;
  // Process names: the host and the accelerator devices.
  std::string host_id = "cpu";
  std::string accelerator_id = "accelerator";
  // Shown in otherData, e.g. the model and batch.
  std::string title;
};

std::string TimelineToChromeTrace(const tandem::v1::Timeline& timeline,
                                  const ChromeTraceOptions& options = {});

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CHROME_TRACE_H_
