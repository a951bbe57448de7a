#include "planner/steady_state.h"

#include <algorithm>
#include <cmath>

namespace tandem::planner {

namespace {

bool Near(double a, double b, double scale) {
  return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(scale), 1e-12);
}

// A period shorter than a resource's work (to 1e-9, so that sums in another
// order change nothing).
bool ShorterThanWork(double period, double busiest_seconds) {
  return period < busiest_seconds * (1 - 1e-9);
}

}  // namespace

bool PeriodSettled(const std::vector<double>& starts, const std::vector<double>& finishes,
                   double busiest_seconds) {
  const size_t n = starts.size();
  if (n < 3) return false;
  const double reported = starts[n - 1] - starts[n - 2];
  const double before = starts[n - 2] - starts[n - 3];
  if (ShorterThanWork(reported, busiest_seconds)) return false;
  if (!Near(reported, before, reported)) return false;
  if (finishes.empty()) return true;
  const double late = finishes[n - 2] - starts[n - 2], earlier = finishes[n - 3] - starts[n - 3];
  return Near(late, earlier, std::max(reported, late));
}

bool KeepSimulating(const std::vector<double>& starts, const std::vector<double>& finishes,
                    double busiest_seconds) {
  const size_t n = starts.size();
  if (PeriodSettled(starts, finishes, busiest_seconds)) return false;
  if (n < static_cast<size_t>(kMaxSimulatedIterations)) return true;
  if (n >= static_cast<size_t>(kMaxBackloggedIterations)) return false;
  const double reported = starts[n - 1] - starts[n - 2];
  if (ShorterThanWork(reported, busiest_seconds)) return true;
  if (finishes.empty()) return false;
  // Still later than half the run before (same parity: a period that
  // alternates between two values is not a backlog).
  const size_t back = n - 2 - 2 * (n / 4);
  const double late = finishes[n - 2] - starts[n - 2];
  return late > finishes[back] - starts[back] + 1e-9 * std::max(reported, late);
}

double ReportedPeriod(const std::vector<double>& starts, const std::vector<double>& finishes,
                      double busiest_seconds) {
  const size_t n = starts.size();
  double period = starts[n - 1] - starts[n - 2];
  if (!PeriodSettled(starts, finishes, busiest_seconds) && n >= 4) {
    const size_t k = 2 * (n / 4);
    period = (starts[n - 1] - starts[n - 1 - k]) / static_cast<double>(k);
  }
  return ShorterThanWork(period, busiest_seconds) ? busiest_seconds : period;
}

int64_t PeakInWindow(const std::vector<MemoryChange>& changes, int64_t base, double window_start,
                     double window_end,
                     google::protobuf::RepeatedPtrField<tandem::v1::MemorySample>* samples) {
  int64_t level = base;
  size_t i = 0;
  const size_t n = changes.size();
  while (i < n && changes[i].time_seconds <= window_start) level += changes[i++].delta_bytes;
  int64_t peak = level;
  auto sample = [&](double t) {
    if (samples == nullptr) return;
    tandem::v1::MemorySample* s = samples->Add();
    s->set_time_seconds(t - window_start);
    s->set_bytes(level);
  };
  sample(window_start);
  while (i < n && changes[i].time_seconds < window_end) {
    const double t = changes[i].time_seconds;
    while (i < n && changes[i].time_seconds == t) level += changes[i++].delta_bytes;
    peak = std::max(peak, level);
    sample(t);
  }
  return peak;
}

// The level at a time counts every change at or before it, so changes at
// equal times form one group; the peak is the level at the window start or
// after any group inside the window.
void WindowLevel::Feed(double t, int64_t delta) {
  if (open_ && t != group_time_) Close();
  if (!open_) {
    open_ = true;
    group_time_ = t;
    level_before_ = level_;
  }
  level_ += delta;
}

int64_t WindowLevel::Finish(double window_end) {
  if (open_) {
    if (Inside(group_time_, window_end)) {
      Close();
    } else {
      level_ = level_before_;
      open_ = false;
    }
  }
  if (!initial_done_) Initial(level_);
  return peak_;
}

void WindowLevel::Close() {
  open_ = false;
  if (!has_start_ || group_time_ < window_start_) return;
  if (group_time_ == window_start_) {
    Initial(level_);
    return;
  }
  if (!initial_done_) Initial(level_before_);
  peak_ = std::max(peak_, level_);
  Sample(group_time_, level_);
}

void WindowLevel::Initial(int64_t level) {
  initial_done_ = true;
  peak_ = level;
  Sample(window_start_, level);
}

void WindowLevel::Sample(double t, int64_t level) {
  if (samples_ == nullptr) return;
  tandem::v1::MemorySample* s = samples_->Add();
  s->set_time_seconds(t - window_start_);
  s->set_bytes(level);
}

}  // namespace tandem::planner
