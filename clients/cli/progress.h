// Renders a job's progress for people: on a terminal, one live line (a bar with
// step, loss, samples/s and ETA) redrawn in place; elsewhere, plain lines that
// scripts and logs can read. Shared by `tandem train` and `tandem watch`.
// Not thread-safe.
#ifndef TANDEM_CLIENTS_CLI_PROGRESS_H_
#define TANDEM_CLIENTS_CLI_PROGRESS_H_

#include <cstdio>
#include <string>
#include <vector>

#include "tandem/v1/job.pb.h"

namespace tandem::cli {

class ProgressPrinter {
 public:
  // `out` is a terminal when `tty`; plain lines otherwise.
  ProgressPrinter(FILE* out, bool tty) : out_(out), tty_(tty) {}
  void Step(const tandem::v1::JobEvent::StepProgress& p);
  void Eval(const tandem::v1::JobEvent::EvalResult& e);
  void Log(tandem::v1::LogSeverity severity, const std::string& message);
  void Checkpoint(const tandem::v1::JobEvent::CheckpointSaved& c);
  void State(const tandem::v1::JobEvent::StateChange& s);
  // Ends a live line so later output starts on a fresh one.
  void Finish();

 private:
  void Line(const std::string& text);

  FILE* out_;
  bool tty_;
  bool live_ = false;
};

// "1h02m", "3m05s", "12s".
std::string FormatDuration(double seconds);

// What a job's update rule did, in one line ("parameter_server: 938 updates,
// staleness mean 1.87 max 2, waited 8.3 s"); "" for synchronous training.
std::string DescribeUpdates(const tandem::v1::UpdateStats& u);

// A pipeline job's stages, a line each ("stage 0 (layers 0-3, emulated:0):
// busy 39.2 ms, bubble 13.1 ms, copies 0.1 ms, update 1.2 ms; peak 10.0 of
// 10.1 MiB predicted"); empty for other jobs.
std::vector<std::string> DescribePipeline(const tandem::v1::JobMetrics& m);
// An fp16 job's loss scaling: "scale 16384, 3 steps skipped (overflows)"; ""
// for the others.
std::string DescribeLossScaling(const tandem::v1::JobMetrics& m);

}  // namespace tandem::cli

#endif  // TANDEM_CLIENTS_CLI_PROGRESS_H_
