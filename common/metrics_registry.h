// MetricsRegistry holds a daemon's Prometheus metrics — counters, gauges
// and histograms, each a family (a name, its help and type) of series told
// apart by labels — and writes them in Prometheus' text exposition format
// (version 0.0.4) for /metrics. Updating a series is a few atomic
// operations (for the paths that report every step); finding one takes the
// registry's lock, so callers keep the reference (it lives as long as the
// registry). Values computed at scrape time (jobs by state) come from
// refresh callbacks run before each exposition. Thread-safe.
#ifndef SHARDLINE_COMMON_METRICS_REGISTRY_H_
#define SHARDLINE_COMMON_METRICS_REGISTRY_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace shardline::common {

// A value that only rises (Prometheus "counter"; names end in _total).
class Counter {
 public:
  void Add(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (Prometheus "gauge").
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Non-negative observations (durations, sizes) counted into buckets by upper
// bound (Prometheus "histogram").
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);

  const std::vector<double>& upper_bounds() const { return bounds_; }
  // Observations <= each bound (cumulative, as exposed), then all of them.
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_.value(); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, the last one +Inf
  Counter sum_;
};

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsRegistry {
 public:
  // The series of `name` with `labels`, made on first use. A name is one
  // kind of metric with one help text; asking for it as another kind is a
  // programming error (CHECK).
  Counter& GetCounter(absl::string_view name, absl::string_view help, const MetricLabels& labels = {});
  Gauge& GetGauge(absl::string_view name, absl::string_view help, const MetricLabels& labels = {});
  Histogram& GetHistogram(absl::string_view name, absl::string_view help, const std::vector<double>& upper_bounds,
                          const MetricLabels& labels = {});

  // Removes every series that has label `name` with `value` (a deleted
  // job's); returns how many. References to them dangle from then on:
  // callers that keep one must not remove its series.
  int RemoveSeries(absl::string_view name, absl::string_view value);

  // `refresh` runs (without the registry's lock) before each Exposition,
  // to set gauges from state kept elsewhere.
  void AddRefresh(std::function<void()> refresh);

  // Every family sorted by name, with # HELP and # TYPE lines.
  std::string Exposition();

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Series {
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    Kind kind;
    std::string help;
    std::map<std::string, Series> series;  // by the labels' text: {a="1",b="2"}
  };
  Series& Find(absl::string_view name, absl::string_view help, Kind kind, const MetricLabels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, Family, std::less<>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> refreshes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_METRICS_REGISTRY_H_
