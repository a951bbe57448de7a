#include "server/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::metrics {
namespace {

void AtomicAdd(std::atomic<double>& target, double by) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + by, std::memory_order_relaxed)) {
  }
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string LabelText(const Labels& labels, const std::string& extra_name = "",
                      const std::string& extra_value = "") {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ",";
    first = false;
    absl::StrAppend(&out, k, "=\"", EscapeLabelValue(v), "\"");
  }
  if (!extra_name.empty()) {
    if (!first) out += ",";
    absl::StrAppend(&out, extra_name, "=\"", extra_value, "\"");
  }
  return out + "}";
}

template <typename T>
const char* TypeName();
template <>
const char* TypeName<Counter>() { return "counter"; }
template <>
const char* TypeName<Gauge>() { return "gauge"; }
template <>
const char* TypeName<Histogram>() { return "histogram"; }

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrFormat("%.0f", value);
  }
  // The shortest form that reads back as the same double (1e-05, not
  // 1.0000000000000001e-05).
  for (int digits = 6; digits < 17; ++digits) {
    const std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

void Counter::Increment(double by) {
  if (by > 0) AtomicAdd(value_, by);
}

void Gauge::Increment(double by) { AtomicAdd(value_, by); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::Assign(const std::vector<uint64_t>& cumulative, double sum) {
  if (cumulative.size() != bounds_.size() + 1) return;
  uint64_t previous = 0;
  for (size_t i = 0; i < cumulative.size(); ++i) {
    buckets_[i].store(cumulative[i] - previous, std::memory_order_relaxed);
    previous = cumulative[i];
  }
  sum_.store(sum, std::memory_order_relaxed);
  count_.store(previous, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  // The count is the +Inf bucket, so the two always agree in one scrape.
  s.count = running;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i) {
    out.push_back(start);
    start *= factor;
  }
  return out;
}

void Registry::Add(std::unique_ptr<FamilyBase> family) {
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(family));
}

std::string Registry::Serialize() const {
  absl::MutexLock lock(&mu_);
  std::vector<const FamilyBase*> sorted;
  for (const auto& f : families_) sorted.push_back(f.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const FamilyBase* a, const FamilyBase* b) { return a->name < b->name; });
  std::string out;
  for (const FamilyBase* f : sorted) f->Serialize(&out);
  return out;
}

template <typename T>
T& Family<T>::Add(const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(labels);
  if (it != series_.end()) return *it->second;
  std::unique_ptr<T> series;
  if constexpr (std::is_same_v<T, Histogram>) {
    series = std::make_unique<Histogram>(bounds_);
  } else {
    series = std::make_unique<T>();
  }
  T& ref = *series;
  series_.emplace(labels, std::move(series));
  return ref;
}

template <typename T>
void Family<T>::Remove(const Labels& labels) {
  absl::MutexLock lock(&mu_);
  series_.erase(labels);
}

template <typename T>
void Family<T>::RemoveWhere(const std::string& name, const std::string& value) {
  absl::MutexLock lock(&mu_);
  for (auto it = series_.begin(); it != series_.end();) {
    auto label = it->first.find(name);
    if (label != it->first.end() && label->second == value) {
      it = series_.erase(it);
    } else {
      ++it;
    }
  }
}

template <typename T>
void Family<T>::Serialize(std::string* out) const {
  absl::MutexLock lock(&mu_);
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n");
  absl::StrAppend(out, "# TYPE ", name, " ", TypeName<T>(), "\n");
  for (const auto& [labels, series] : series_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = series->Collect();
      for (size_t i = 0; i < s.bounds.size(); ++i) {
        absl::StrAppend(out, name, "_bucket", LabelText(labels, "le", FormatValue(s.bounds[i])), " ",
                        s.cumulative[i], "\n");
      }
      absl::StrAppend(out, name, "_bucket", LabelText(labels, "le", "+Inf"), " ", s.count, "\n");
      absl::StrAppend(out, name, "_sum", LabelText(labels), " ", FormatValue(s.sum), "\n");
      absl::StrAppend(out, name, "_count", LabelText(labels), " ", s.count, "\n");
    } else {
      absl::StrAppend(out, name, LabelText(labels), " ", FormatValue(series->Value()), "\n");
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

}  // namespace tandem::metrics
