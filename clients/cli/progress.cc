#include "clients/cli/progress.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::cli {

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

void ProgressPrinter::Line(const std::string& text) {
  Finish();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressPrinter::Finish() {
  if (live_) {
    std::fprintf(out_, "\n");
    live_ = false;
  }
}

void ProgressPrinter::Step(const tandem::v1::JobEvent::StepProgress& p) {
  const double fraction = p.total_steps() > 0
                              ? static_cast<double>(p.step()) / static_cast<double>(p.total_steps())
                              : 0;
  if (!tty_) {
    std::fprintf(out_, "step %lld/%lld epoch %lld loss %.4f %.0f samples/s eta %s\n",
                 static_cast<long long>(p.step()), static_cast<long long>(p.total_steps()),
                 static_cast<long long>(p.epoch()), p.loss(), p.samples_per_second(),
                 FormatDuration(p.eta_seconds()).c_str());
    std::fflush(out_);
    return;
  }
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(out_, "\r\033[K[%s] %3.0f%% step %lld/%lld loss %.4f %.0f samples/s eta %s",
               bar.c_str(), 100 * fraction, static_cast<long long>(p.step()),
               static_cast<long long>(p.total_steps()), p.loss(), p.samples_per_second(),
               FormatDuration(p.eta_seconds()).c_str());
  std::fflush(out_);
  live_ = true;
}

void ProgressPrinter::Eval(const tandem::v1::JobEvent::EvalResult& e) {
  Line(absl::StrFormat("eval step %d: loss %.4f accuracy %.4f (%d samples)", e.step(), e.loss(),
                       e.accuracy(), e.samples()));
}

void ProgressPrinter::Log(tandem::v1::LogSeverity severity, const std::string& message) {
  const char* tag = severity == tandem::v1::LOG_SEVERITY_ERROR     ? "error: "
                    : severity == tandem::v1::LOG_SEVERITY_WARNING ? "warning: "
                                                                   : "";
  Line(absl::StrCat(tag, message));
}

void ProgressPrinter::Checkpoint(const tandem::v1::JobEvent::CheckpointSaved& c) {
  if (tty_) return;  // Too chatty for a live display.
  Line(absl::StrFormat("checkpoint step %d: %s (%d bytes)", c.step(), c.path(), c.bytes()));
}

void ProgressPrinter::State(const tandem::v1::JobEvent::StateChange& s) {
  std::string line = absl::StrCat("state ", tandem::v1::JobState_Name(s.to()));
  if (!s.reason().empty()) absl::StrAppend(&line, ": ", s.reason());
  Line(line);
}

std::string DescribeUpdates(const tandem::v1::UpdateStats& u) {
  if (u.rule().empty() || u.rule() == "synchronous") return "";
  std::string line = absl::StrFormat("%s: %d updates", u.rule(), u.updates());
  if (u.rule() == "hogwild" || u.rule() == "parameter_server") {
    absl::StrAppendFormat(&line, ", staleness mean %.2f max %d", u.mean_staleness(),
                          u.max_staleness());
  }
  if (u.wait_seconds() > 0) absl::StrAppendFormat(&line, ", waited %.1f s", u.wait_seconds());
  if (u.exchanges() > 0) absl::StrAppendFormat(&line, ", %d exchanges", u.exchanges());
  if (u.swa_models() > 0) {
    absl::StrAppendFormat(&line, ", average of %d models", u.swa_models());
    if (u.swa_eval_accuracy() > 0) {
      absl::StrAppendFormat(&line, ": test accuracy %.4f (loss %.4f)", u.swa_eval_accuracy(),
                            u.swa_eval_loss());
    }
  }
  return line;
}

std::string DescribeLossScaling(const tandem::v1::JobMetrics& m) {
  if (m.loss_scale() <= 0) return "";
  return absl::StrFormat("scale %g, %d step%s skipped (fp16 overflows)", m.loss_scale(),
                         m.skipped_steps(), m.skipped_steps() == 1 ? "" : "s");
}

std::vector<std::string> DescribePipeline(const tandem::v1::JobMetrics& m) {
  std::vector<std::string> lines;
  for (const tandem::v1::PipelineStageStats& s : m.pipeline_stages()) {
    lines.push_back(absl::StrFormat(
        "stage %d (layers %d-%d, %s): busy %.1f ms, bubble %.1f ms, copies %.1f ms, update "
        "%.1f ms; peak %.1f MiB, %.1f predicted",
        s.stage(), s.first_layer(), s.last_layer(), s.device(), s.busy_seconds() * 1e3,
        s.bubble_seconds() * 1e3, s.copy_seconds() * 1e3, s.update_seconds() * 1e3,
        s.peak_bytes() / 1048576.0, s.predicted_bytes() / 1048576.0));
    if (s.peer_link() || s.peer_copy_seconds() > 0) {
      lines.back() +=
          absl::StrFormat("; %.1f ms of the copies over peer links", s.peer_copy_seconds() * 1e3);
    }
    if (s.recompute()) lines.back() += "; recomputes its activations";
    if (s.offload_activations()) {
      lines.back() += "; its activations wait on the host between forward and backward";
    }
    if (s.wait_for_activation_copies()) lines.back() += " (the stage waiting for each copy)";
    if (s.offload_optimizer() && s.host_updated_layers() > 0) {
      lines.back() +=
          absl::StrFormat("; optimizer state and update of its last %d layers on the host",
                          s.host_updated_layers());
    } else if (s.offload_optimizer()) {
      lines.back() += "; optimizer state and update on the host";
    }
    if (s.stream_weights()) {
      lines.back() += absl::StrFormat(
          ", and their weights, streamed up for each forward and backward (waited %.1f ms)",
          s.weight_fetch_seconds() * 1e3);
    }
  }
  return lines;
}

}  // namespace tandem::cli
