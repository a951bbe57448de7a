// A small Prometheus metrics registry with prometheus-cpp's shape:
//
//   auto& family = BuildCounter().Name("tandem_rpc_requests_total")
//                      .Help("RPCs by method and code.").Register(registry);
//   family.Add({{"method", "SubmitJob"}, {"code", "OK"}}).Increment();
//
// Counters, gauges and histograms, each a family of series keyed by labels,
// serialised in the text exposition format 0.0.4. Metric objects are stable
// (references stay valid until Remove); updates are lock-free atomics, so the
// training loop can record per step without contention. Registration and
// serialisation take a mutex. Thread-safe.
#ifndef TANDEM_SERVER_METRICS_REGISTRY_H_
#define TANDEM_SERVER_METRICS_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::metrics {

using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

class Counter {
 public:
  void Increment(double by = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double by = 1.0);
  void Decrement(double by = 1.0) { Increment(-by); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // Upper bounds, strictly increasing; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Overwrites the series with observations counted elsewhere (a histogram
  // mirrored at scrape time, e.g. the profiler's per-layer timings):
  // `cumulative` as in Snapshot, one entry per bound plus +Inf. Ignored when
  // its length does not match the bounds.
  void Assign(const std::vector<uint64_t>& cumulative, double sum);
  // Cumulative counts per bound (and +Inf last), the sum and the count.
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Collect() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
  std::atomic<uint64_t> count_{0};
};

// Exponential bucket bounds: start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

template <typename T>
class Family;

class Registry {
 public:
  // Internal: a family's type-erased serialisation.
  struct FamilyBase {
    virtual ~FamilyBase() = default;
    virtual void Serialize(std::string* out) const = 0;
    std::string name, help;
  };

  // The text exposition of every family, sorted by name.
  std::string Serialize() const;

 private:
  template <typename T>
  friend class Builder;
  void Add(std::unique_ptr<FamilyBase> family);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
class Family : public Registry::FamilyBase {
 public:
  // The series for `labels`, created on first use. Label names must match
  // [a-zA-Z_][a-zA-Z0-9_]*; values are escaped on output.
  T& Add(const Labels& labels);
  // Histogram families take the bucket bounds of new series from the builder.
  void Remove(const Labels& labels);
  // Removes every series whose label `name` has `value`.
  void RemoveWhere(const std::string& name, const std::string& value);
  void Serialize(std::string* out) const override;

 private:
  template <typename U>
  friend class Builder;
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
  std::vector<double> bounds_;
};

template <typename T>
class Builder {
 public:
  Builder& Name(std::string name) {
    name_ = std::move(name);
    return *this;
  }
  Builder& Help(std::string help) {
    help_ = std::move(help);
    return *this;
  }
  // Histograms only.
  Builder& Buckets(std::vector<double> bounds) {
    bounds_ = std::move(bounds);
    return *this;
  }
  Family<T>& Register(Registry& registry) {
    auto family = std::make_unique<Family<T>>();
    family->name = name_;
    family->help = help_;
    family->bounds_ = bounds_;
    Family<T>* raw = family.get();
    registry.Add(std::move(family));
    return *raw;
  }

 private:
  std::string name_, help_;
  std::vector<double> bounds_;
};

inline Builder<Counter> BuildCounter() { return Builder<Counter>(); }
inline Builder<Gauge> BuildGauge() { return Builder<Gauge>(); }
inline Builder<Histogram> BuildHistogram() { return Builder<Histogram>(); }

// Escapes a label value for the text format (backslash, quote, newline).
std::string EscapeLabelValue(const std::string& value);
// Prometheus's number formatting: integers plainly, NaN/+Inf/-Inf by name.
std::string FormatValue(double value);

}  // namespace tandem::metrics

#endif  // TANDEM_SERVER_METRICS_REGISTRY_H_
