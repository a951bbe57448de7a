#include "runtime/profile/chrome_trace.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/json_quote.h"

namespace tandem::profile {
namespace {

using tandem::v1::TimelineResource;

constexpr int kHostPid = 1;
constexpr int kAcceleratorPid = 2;

// Microseconds with nanosecond resolution.
std::string Micros(double seconds) { return absl::StrFormat("%.3f", seconds * 1e6); }

struct Track {
  int pid;
  int tid;
  std::string name;
};

Track TrackOf(TimelineResource resource, int lane) {
  switch (resource) {
    case tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE:
      return {kHostPid, 1 + lane, lane == 0 ? "compute" : absl::StrCat("compute worker ", lane)};
    case tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE:
      return {kHostPid, 101 + lane, absl::StrCat("update worker ", lane)};
    case tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE:
      return {kAcceleratorPid, 1 + lane,
              lane == 0 ? "compute stream" : absl::StrCat("compute stream ", lane)};
    // Past the compute streams of up to 64 pipeline stages (tids 1-64).
    case tandem::v1::TIMELINE_RESOURCE_COPY_H2D:
      return {kAcceleratorPid, 301 + 2 * lane,
              lane == 0 ? "copy H2D" : absl::StrCat("copy H2D ", lane)};
    case tandem::v1::TIMELINE_RESOURCE_COPY_D2H:
      return {kAcceleratorPid, 302 + 2 * lane,
              lane == 0 ? "copy D2H" : absl::StrCat("copy D2H ", lane)};
    case tandem::v1::TIMELINE_RESOURCE_NETWORK:
      return {kHostPid, 201, "network (gradient all-reduce)"};
    default:
      return {kHostPid, 200, "other"};
  }
}

// "forward", "parameter_h2d", ... from TIMELINE_PHASE_FORWARD.
std::string PhaseName(tandem::v1::TimelinePhase phase) {
  absl::string_view name = tandem::v1::TimelinePhase_Name(phase);
  absl::ConsumePrefix(&name, "TIMELINE_PHASE_");
  return absl::AsciiStrToLower(name);
}

std::string LayerName(int layer, const ChromeTraceOptions& options) {
  if (layer < 0) return "optimizer";
  if (layer < static_cast<int>(options.layer_names.size())) return options.layer_names[layer];
  return absl::StrCat("layer ", layer);
}

std::string Metadata(const char* what, int pid, int tid, const std::string& name) {
  return absl::StrCat("{\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid,
                      ",\"args\":{\"name\":", JsonQuote(name), "}}");
}

std::string SortIndex(const char* what, int pid, int tid, int index) {
  return absl::StrCat("{\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid,
                      ",\"args\":{\"sort_index\":", index, "}}");
}

}  // namespace

std::string TimelineToChromeTrace(const tandem::v1::Timeline& timeline,
                                  const ChromeTraceOptions& options) {
  std::vector<std::string> events;
  std::map<std::pair<int, int>, std::string> threads;
  std::set<int> processes;
  for (const tandem::v1::TimelineSpan& span : timeline.spans()) {
    const Track track = TrackOf(span.resource(), span.lane());
    threads[{track.pid, track.tid}] = track.name;
    processes.insert(track.pid);
    const std::string phase = PhaseName(span.phase());
    std::string args =
        absl::StrCat("\"layer\":", span.layer(), ",\"micro_batch\":", span.micro_batch());
    if (span.bytes() != 0) absl::StrAppend(&args, ",\"bytes\":", span.bytes());
    events.push_back(absl::StrCat(
        "{\"name\":", JsonQuote(absl::StrCat(LayerName(span.layer(), options), " ", phase)),
        ",\"cat\":", JsonQuote(phase), ",\"ph\":\"X\",\"ts\":", Micros(span.start_seconds()),
        ",\"dur\":", Micros(std::max(0.0, span.end_seconds() - span.start_seconds())),
        ",\"pid\":", track.pid, ",\"tid\":", track.tid, ",\"args\":{", args, "}}"));
  }
  const std::pair<int, const google::protobuf::RepeatedPtrField<tandem::v1::MemorySample>*>
      memories[] = {{kHostPid, &timeline.host_memory()},
                    {kAcceleratorPid, &timeline.accelerator_memory()}};
  for (const auto& [pid, samples] : memories) {
    for (const tandem::v1::MemorySample& m : *samples) {
      processes.insert(pid);
      events.push_back(
          absl::StrCat("{\"name\":\"memory\",\"ph\":\"C\",\"ts\":", Micros(m.time_seconds()),
                       ",\"pid\":", pid, ",\"args\":{\"bytes\":", m.bytes(), "}}"));
    }
  }
  std::vector<std::string> metadata;
  for (int pid : processes) {
    const std::string& name = pid == kHostPid ? options.host_id : options.accelerator_id;
    metadata.push_back(Metadata("process_name", pid, 0, name));
    metadata.push_back(SortIndex("process_sort_index", pid, 0, pid));
  }
  for (const auto& [key, name] : threads) {
    metadata.push_back(Metadata("thread_name", key.first, key.second, name));
    metadata.push_back(SortIndex("thread_sort_index", key.first, key.second, key.second));
  }
  metadata.insert(metadata.end(), events.begin(), events.end());
  std::string other = absl::StrCat(
      "\"source\":", JsonQuote(timeline.source()),
      ",\"iteration_seconds\":", absl::StrFormat("%.9g", timeline.iteration_seconds()));
  if (!options.title.empty()) absl::StrAppend(&other, ",\"title\":", JsonQuote(options.title));
  return absl::StrCat("{\"traceEvents\":[\n", absl::StrJoin(metadata, ",\n"),
                      "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{", other, "}}\n");
}

}  // namespace tandem::profile
