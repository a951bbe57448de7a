#include "runtime/profile/profile_report.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"
#include "google/protobuf/util/time_util.h"
#include "runtime/core/allocator.h"

namespace tandem::profile {
namespace {

using tandem::v1::Counter;
using tandem::v1::LayerDeviceProfile;
using tandem::v1::LayerMemory;
using tandem::v1::LayerProfile;
using tandem::v1::PhaseProfile;

std::string Ms(double seconds) { return absl::StrFormat("%.3f", seconds * 1e3); }

// "1.234 ±0.041": the median and half the p10-p90 range, in ms.
std::string TimingCell(const PhaseProfile* phase) {
  if (phase == nullptr || phase->timing().samples() == 0) return "-";
  const auto& t = phase->timing();
  return absl::StrCat(Ms(t.median_seconds()), " ±", Ms((t.p90_seconds() - t.p10_seconds()) / 2));
}

std::string Rate(double flops, const PhaseProfile* phase) {
  if (phase == nullptr || phase->timing().samples() == 0 || phase->timing().median_seconds() <= 0 ||
      flops <= 0) {
    return "-";
  }
  return absl::StrFormat("%.2f", flops / phase->timing().median_seconds() / 1e9);
}

const LayerDeviceProfile* OnDevice(const LayerProfile& layer, const std::string& device) {
  for (const LayerDeviceProfile& d : layer.devices()) {
    if (d.device_id() == device) return &d;
  }
  return nullptr;
}

const PhaseProfile* Forward(const LayerDeviceProfile* d) {
  return d != nullptr && d->has_forward() ? &d->forward() : nullptr;
}
const PhaseProfile* Backward(const LayerDeviceProfile* d) {
  return d != nullptr && d->has_backward() ? &d->backward() : nullptr;
}
const PhaseProfile* Update(const LayerDeviceProfile* d) {
  return d != nullptr && d->has_update() ? &d->update() : nullptr;
}

const Counter* FindCounter(const PhaseProfile* phase, const std::string& name) {
  if (phase == nullptr) return nullptr;
  for (const Counter& c : phase->counters()) {
    if (c.name() == name) return &c;
  }
  return nullptr;
}

// A counter value in a readable unit: seconds as ms, large counts in millions.
std::string CounterCell(const Counter* c) {
  if (c == nullptr) return "-";
  if (c->unit() == "seconds") return Ms(c->value());
  if (c->unit() == "bytes") return FormatBytes(static_cast<int64_t>(c->value()));
  if (std::fabs(c->value()) >= 1e6) return absl::StrFormat("%.2fM", c->value() / 1e6);
  return absl::StrFormat("%.0f", c->value());
}

std::string CounterHeading(const Counter& c) {
  if (c.name() == "task_clock") return "task-clock ms";
  if (c.name() == "page_faults") return "faults";
  if (c.name() == "context_switches") return "ctx-sw";
  if (c.unit() == "seconds") return absl::StrCat(c.name(), " ms");
  return c.name();
}

std::string SourceName(tandem::v1::CounterSource source) {
  switch (source) {
    case tandem::v1::COUNTER_SOURCE_HARDWARE:
      return "hardware";
    case tandem::v1::COUNTER_SOURCE_SOFTWARE:
      return "software";
    case tandem::v1::COUNTER_SOURCE_CUPTI:
      return "CUPTI";
    case tandem::v1::COUNTER_SOURCE_CUDA_EVENT:
      return "CUDA events";
    case tandem::v1::COUNTER_SOURCE_MEMORY_SCAN:
      return "memory scan";
    default:
      return "none";
  }
}

// Left-aligned columns of a table, each as wide as its widest cell.
std::string Table(const std::vector<std::vector<std::string>>& rows, int indent = 2) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line(indent, ' ');
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// "3.20 KiB", or "3.20 KiB (+24 B)" when the measured figure differs.
std::string MemoryCell(int64_t analytic, int64_t measured, bool have_measured) {
  std::string cell = FormatBytes(analytic);
  if (have_measured && measured != analytic) {
    const int64_t diff = measured - analytic;
    absl::StrAppend(&cell, " (", diff > 0 ? "+" : "-", FormatBytes(std::llabs(diff)), ")");
  }
  return cell;
}

// The device's name, peak rates, iteration peak and counter source.
void AppendDeviceSummary(const tandem::v1::DeviceProfile& device, std::string* out) {
  absl::StrAppend(out, "\ndevice ", device.id(), ": ", device.name());
  if (device.memory_bytes() > 0) absl::StrAppend(out, ", ", FormatBytes(device.memory_bytes()));
  absl::StrAppend(out, "\n");
  std::vector<std::vector<std::string>> rows;
  // A GPU's GEMM may use TF32 and its bandwidth is a device copy's (the
  // counter note says how each was measured).
  const bool gpu = device.kind() == tandem::v1::DEVICE_KIND_CUDA;
  rows.push_back({gpu ? "GEMM (fp32 or TF32, see note)" : "GEMM (fp32)",
                  device.gemm_flops_per_second() > 0
                      ? absl::StrFormat("%.1f GFLOP/s", device.gemm_flops_per_second() / 1e9)
                      : "-"});
  if (device.single_thread_gemm_flops_per_second() > 0 && device.threads() > 1) {
    rows.push_back(
        {"GEMM (fp32, one thread)",
         absl::StrFormat("%.1f GFLOP/s", device.single_thread_gemm_flops_per_second() / 1e9)});
  }
  if (device.bf16_gemm_flops_per_second() > 0) {
    rows.push_back({"GEMM (bf16, fp32 accumulation)",
                    absl::StrFormat("%.1f GFLOP/s", device.bf16_gemm_flops_per_second() / 1e9)});
  }
  rows.push_back(
      {gpu ? "memory bandwidth (device copy)" : "memory bandwidth (triad)",
       device.memory_bandwidth_bytes_per_second() > 0
           ? absl::StrFormat("%.1f GB/s", device.memory_bandwidth_bytes_per_second() / 1e9)
           : "-"});
  rows.push_back({"iteration peak", device.iteration_peak_bytes() > 0
                                        ? FormatBytes(device.iteration_peak_bytes())
                                        : "-"});
  rows.push_back(
      {"counters", absl::StrCat(SourceName(device.counter_source()), ": ",
                                device.counter_note().empty() ? "-" : device.counter_note())});
  if (gpu) {
    rows.push_back({"CUPTI overhead", absl::StrCat(Ms(device.profiler_overhead_seconds()), " ms")});
    rows.push_back({"CUPTI dropped records", absl::StrCat(device.dropped_records())});
  }
  absl::StrAppend(out, Table(rows));
}

// Each layer's phase times on the device, with their sum.
void AppendDeviceTimes(const tandem::v1::Profile& profile, const tandem::v1::DeviceProfile& device,
                       std::string* out) {
  absl::StrAppend(out, "\n  time per call on ", device.id(),
                  ", ms: median ±half the p10-p90 range; GFLOP/s = analytic FLOPs / median\n");
  std::vector<std::vector<std::string>> rows;
  rows.push_back(
      {"#", "layer", "kind", "forward", "backward", "update", "fwd GFLOP/s", "bwd GFLOP/s"});
  double total_fwd = 0, total_bwd = 0, total_upd = 0;
  int samples = 0;
  for (const LayerProfile& layer : profile.layers()) {
    const LayerDeviceProfile* d = OnDevice(layer, device.id());
    const PhaseProfile *f = Forward(d), *b = Backward(d), *u = Update(d);
    if (f != nullptr) total_fwd += f->timing().median_seconds();
    if (b != nullptr) total_bwd += b->timing().median_seconds();
    if (u != nullptr) total_upd += u->timing().median_seconds();
    if (f != nullptr) samples = f->timing().samples();
    rows.push_back({absl::StrCat(layer.index()), layer.name(), layer.kind(), TimingCell(f),
                    TimingCell(b), TimingCell(u), Rate(layer.forward_flops(), f),
                    Rate(layer.backward_flops(), b)});
  }
  rows.push_back({"", "sum of medians", "", Ms(total_fwd), Ms(total_bwd), Ms(total_upd)});
  absl::StrAppend(out, Table(rows));
  if (samples > 0) absl::StrAppend(out, "  (", samples, " timed calls per phase)\n");
}

// Each layer's counters on the device (its own: perf, CUPTI; not the memory
// scan), with the calling thread's CPU time on a CPU.
void AppendDeviceCounters(const tandem::v1::Profile& profile,
                          const tandem::v1::DeviceProfile& device, std::string* out) {
  // Counters: the device's own (perf, CUPTI), not the memory scan.
  std::vector<Counter> kinds;
  for (const LayerProfile& layer : profile.layers()) {
    const LayerDeviceProfile* d = OnDevice(layer, device.id());
    for (const PhaseProfile* p : {Forward(d), Backward(d)}) {
      if (p == nullptr) continue;
      for (const Counter& c : p->counters()) {
        if (c.source() == tandem::v1::COUNTER_SOURCE_MEMORY_SCAN) continue;
        if (std::none_of(kinds.begin(), kinds.end(),
                         [&](const Counter& k) { return k.name() == c.name(); })) {
          kinds.push_back(c);
        }
      }
    }
  }
  // The calling thread's CPU time is a CPU device's own figure.
  const bool thread_cpu = device.kind() == tandem::v1::DEVICE_KIND_CPU;
  if (kinds.empty() && !thread_cpu) {
    absl::StrAppend(out, "\n  counters on ", device.id(), ": none (",
                    device.counter_note().empty() ? "no counter source" : device.counter_note(),
                    ")\n");
    return;
  }
  absl::StrAppend(
      out, "\n  counters on ", device.id(), ", median per call (",
      kinds.empty() ? "no counters" : SourceName(kinds[0].source()),
      thread_cpu ? "; thread cpu = the calling thread's CPU time, workers excluded" : "", ")\n");
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> heading = {"#", "layer"};
  for (const char* phase : {"fwd", "bwd"}) {
    if (thread_cpu) heading.push_back(absl::StrCat(phase, " thread cpu ms"));
    for (const Counter& k : kinds) heading.push_back(absl::StrCat(phase, " ", CounterHeading(k)));
  }
  rows.push_back(heading);
  for (const LayerProfile& layer : profile.layers()) {
    const LayerDeviceProfile* d = OnDevice(layer, device.id());
    std::vector<std::string> row = {absl::StrCat(layer.index()), layer.name()};
    for (const PhaseProfile* p : {Forward(d), Backward(d)}) {
      if (thread_cpu) row.push_back(p == nullptr ? "-" : Ms(p->timing().thread_cpu_seconds()));
      for (const Counter& k : kinds) row.push_back(CounterCell(FindCounter(p, k.name())));
    }
    rows.push_back(row);
  }
  absl::StrAppend(out, Table(rows));
}

void AppendDevice(const tandem::v1::Profile& profile, const tandem::v1::DeviceProfile& device,
                  std::string* out) {
  AppendDeviceSummary(device, out);
  AppendDeviceTimes(profile, device, out);
  AppendDeviceCounters(profile, device, out);
}

void AppendMemory(const tandem::v1::Profile& profile, std::string* out) {
  const std::string device = profile.devices_size() > 0 ? profile.devices(0).id() : std::string();
  absl::StrAppend(
      out, "\nmemory per layer at batch ", profile.batch_size(), ": analytic",
      device.empty() ? "" : absl::StrCat(" (measured on ", device, " where it differs)"),
      "; scan = bytes of the saved / workspace regions written (fwd, bwd)\n");
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"#", "layer", "parameters", "gradients", "optimizer", "activations", "workspace",
                  "output", "saved written", "workspace written fwd/bwd"});
  int agree = 0;
  std::vector<std::string> differences;
  LayerMemory total_analytic, total_measured;
  for (const LayerProfile& layer : profile.layers()) {
    const LayerDeviceProfile* d = device.empty() ? nullptr : OnDevice(layer, device);
    const bool have = d != nullptr && d->has_measured_memory();
    const LayerMemory& a = layer.analytic_memory();
    const LayerMemory m = have ? d->measured_memory() : LayerMemory();
    const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
        {"parameters", {a.parameter_bytes(), m.parameter_bytes()}},
        {"gradients", {a.gradient_bytes(), m.gradient_bytes()}},
        {"optimizer state", {a.optimizer_state_bytes(), m.optimizer_state_bytes()}},
        {"activations", {a.activation_bytes(), m.activation_bytes()}},
        {"workspace", {a.workspace_bytes(), m.workspace_bytes()}},
        {"output", {a.output_bytes(), m.output_bytes()}},
    };
    bool same = true;
    for (const auto& [name, values] : fields) {
      if (have && values.first != values.second) {
        same = false;
        differences.push_back(absl::StrFormat("%s %s: analytic %d B, measured %d B (%+d B)",
                                              layer.name(), name, values.first, values.second,
                                              values.second - values.first));
      }
    }
    if (have && same) ++agree;
    std::vector<std::string> row = {absl::StrCat(layer.index()), layer.name()};
    for (const auto& [name, values] : fields)
      row.push_back(MemoryCell(values.first, values.second, have));
    const Counter* saved = FindCounter(Forward(d), "saved_bytes_written");
    const Counter* ws_f = FindCounter(Forward(d), "workspace_bytes_written");
    const Counter* ws_b = FindCounter(Backward(d), "workspace_bytes_written");
    row.push_back(CounterCell(saved));
    row.push_back(ws_f == nullptr && ws_b == nullptr
                      ? "-"
                      : absl::StrCat(CounterCell(ws_f), " / ", CounterCell(ws_b)));
    rows.push_back(row);
  }
  absl::StrAppend(out, Table(rows));
  if (!device.empty()) {
    absl::StrAppend(out, "  analytic and measured bytes agree for ", agree, " of ",
                    profile.layers_size(), " layers");
    if (differences.empty()) {
      absl::StrAppend(out, "\n");
    } else {
      absl::StrAppend(out, "; they differ in:\n");
      for (const std::string& d : differences) absl::StrAppend(out, "    ", d, "\n");
      // Two sources of measurement, so two kinds of difference: the state is
      // the allocator's accounting of the model's padded layout, the rest is
      // what the layer's calls wrote.
      absl::StrAppend(
          out,
          "  (measured parameters, gradients and optimizer state are the allocator's accounting: "
          "each layer's slices are padded to a 64-byte boundary in the model's contiguous "
          "buffers, and non-trainable buffers such as BatchNorm statistics count as parameters; "
          "measured activations (output + saved), output and workspace are the highest byte the "
          "layer's calls wrote into its regions on this device: less than declared means the "
          "layer wrote less here (a declaration covers every device's code path, and the 64-byte "
          "alignment of its last tensor), more means it writes past its declaration)\n");
    }
  }
}

void AppendLinks(const tandem::v1::Profile& profile, std::string* out) {
  if (profile.links_size() == 0) {
    absl::StrAppend(out, "\nlinks: none measured (no profiled device has a host link)\n");
    return;
  }
  absl::StrAppend(out, "\nlinks: bandwidth at the largest size, latency at the smallest\n");
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"from", "to", "host memory", "bandwidth", "latency", "samples"});
  for (const tandem::v1::LinkProfile& link : profile.links()) {
    std::vector<std::string> samples;
    for (const auto& s : link.samples()) {
      samples.push_back(
          absl::StrFormat("%s: %.2f GB/s", FormatBytes(s.bytes()), s.bytes_per_second() / 1e9));
    }
    rows.push_back(
        {link.from_device_id(), link.to_device_id(), link.pinned() ? "pinned" : "pageable",
         absl::StrFormat("%.2f GB/s", link.bandwidth_bytes_per_second() / 1e9),
         absl::StrFormat("%.1f us", link.latency_seconds() * 1e6), absl::StrJoin(samples, ", ")});
  }
  absl::StrAppend(out, Table(rows));
}

}  // namespace

std::string FormatProfileReport(const tandem::v1::Profile& profile, const ReportOptions& options) {
  std::string out;
  int64_t parameters = 0;
  for (const LayerProfile& layer : profile.layers()) parameters += layer.parameter_count();
  absl::StrAppend(&out, "model ", profile.model_fingerprint().substr(0, 12), ": ",
                  profile.layers_size(), " layers, ", parameters, " parameters; batch ",
                  profile.batch_size(), " x ", ShapeText(profile.sample_shape()), "; ",
                  profile.optimizer_state_per_parameter(), " optimizer moments per parameter\n");
  const auto& p = profile.provenance();
  if (p.source() == "measured") {
    std::vector<std::string> versions;
    for (const auto& [k, v] : p.versions()) versions.push_back(absl::StrCat(k, " ", v));
    std::sort(versions.begin(), versions.end());
    absl::StrAppend(&out, "measured on ", p.hostname(), " at ",
                    google::protobuf::util::TimeUtil::ToString(p.create_time()), " in ",
                    absl::StrFormat("%.1f s", p.profiling_seconds()), ": ", p.iterations(),
                    " timed calls per phase after ", p.warmup_iterations(), " warm-up; ",
                    options.cached ? "from the cache" : "fresh", " (key ", p.cache_key(), ")\n");
    absl::StrAppend(&out, "versions: ", absl::StrJoin(versions, ", "), "\n");
  } else {
    absl::StrAppend(&out, "source: ", p.source().empty() ? "unknown" : p.source(), "\n");
  }
  for (const tandem::v1::DeviceProfile& device : profile.devices())
    AppendDevice(profile, device, &out);
  AppendMemory(profile, &out);
  AppendLinks(profile, &out);
  return out;
}

}  // namespace tandem::profile
