#include "runtime/profile/job_telemetry.h"

#include "absl/strings/ascii.h"

namespace tandem::profile {

bool OnAccelerator(tandem::v1::TimelineResource resource) {
  return resource == tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE ||
         resource == tandem::v1::TIMELINE_RESOURCE_COPY_H2D ||
         resource == tandem::v1::TIMELINE_RESOURCE_COPY_D2H;
}

std::string ResourceLabel(tandem::v1::TimelineResource resource) {
  // The proto's names less "TIMELINE_RESOURCE_": one vocabulary for the
  // timeline, the traces and the metrics.
  constexpr size_t kPrefix = sizeof("TIMELINE_RESOURCE_") - 1;
  const std::string& name = tandem::v1::TimelineResource_Name(resource);
  return absl::AsciiStrToLower(name.size() > kPrefix ? name.substr(kPrefix) : name);
}

JobTelemetry::JobTelemetry(std::vector<std::string> layer_names)
    : layers_(std::move(layer_names)) {}

void JobTelemetry::Record(int layer, Phase phase, double seconds) {
  layers_.Record(layer, phase, seconds);
}

void JobTelemetry::RecordSpans(const ResourceSpanBatch& batch) {
  absl::MutexLock lock(&mu_);
  if (!batch.accelerator.empty()) accelerator_ = batch.accelerator;
  pinned_host_bytes_ = batch.pinned_host_bytes;
  if (batch.accelerator_memory) accelerator_memory_ = batch.accelerator_memory;
  for (const ResourceSpan& span : batch.spans) {
    Totals& t = totals_[span.resource];
    if (span.busy_seconds > 0) t.busy_seconds += span.busy_seconds;
    t.bytes += span.bytes;
    if (span.wait_seconds > 0 && span.waited_on != tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED) {
      waits_[{span.resource, span.waited_on}] += span.wait_seconds;
    }
  }
}

ResourceUsageSnapshot JobTelemetry::ResourceSnapshot() const {
  ResourceUsageSnapshot s;
  absl::MutexLock lock(&mu_);
  s.accelerator = accelerator_;
  s.pinned_host_bytes = pinned_host_bytes_;
  s.accelerator_memory = accelerator_memory_;
  for (const auto& [resource, t] : totals_) {
    s.resources.push_back({.resource = resource, .busy_seconds = t.busy_seconds, .bytes = t.bytes});
  }
  for (const auto& [key, seconds] : waits_) {
    s.waits.push_back({.resource = key.first, .waited_on = key.second, .seconds = seconds});
  }
  return s;
}

}  // namespace tandem::profile
