#include "common/metrics_registry.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace shardline::common {
namespace {

// Go's float text as Prometheus reads it: integers without a fraction,
// others with 15 significant digits, and the three special values.
std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.15g", value);
}

// A label value with \, " and newlines escaped.
std::string Escape(absl::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// `labels` as {a="1",b="2"}; empty for none.
std::string LabelText(const MetricLabels& labels) {
  std::string text;
  for (const auto& [name, value] : labels) {
    absl::StrAppend(&text, text.empty() ? "" : ",", name, "=\"", Escape(value), "\"");
  }
  return text.empty() ? "" : absl::StrCat("{", text, "}");
}

// A help text with \ and newlines escaped.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

void Counter::Add(double amount) {
  if (!(amount > 0)) return;  // a counter never falls (nor takes NaN)
  double old = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(old, old + amount, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i + 1 < bounds_.size(); ++i) CHECK_LT(bounds_[i], bounds_[i + 1]) << "bounds must rise";
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i] = 0;
}

void Histogram::Observe(double value) {
  if (!(value >= 0)) return;  // durations and sizes: a negative or NaN one is dropped
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.Add(value);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    counts[i] = total;
  }
  return counts;
}

MetricsRegistry::Series& MetricsRegistry::Find(absl::string_view name, absl::string_view help, Kind kind,
                                               const MetricLabels& labels) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    it = families_.emplace(std::string(name), Family{kind, std::string(help), {}}).first;
  }
  CHECK(it->second.kind == kind) << "metric " << name << " asked for as two kinds";
  return it->second.series[LabelText(labels)];
}

Counter& MetricsRegistry::GetCounter(absl::string_view name, absl::string_view help, const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  Series& s = Find(name, help, Kind::kCounter, labels);
  if (s.counter == nullptr) s.counter = std::make_unique<Counter>();
  return *s.counter;
}

Gauge& MetricsRegistry::GetGauge(absl::string_view name, absl::string_view help, const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  Series& s = Find(name, help, Kind::kGauge, labels);
  if (s.gauge == nullptr) s.gauge = std::make_unique<Gauge>();
  return *s.gauge;
}

Histogram& MetricsRegistry::GetHistogram(absl::string_view name, absl::string_view help,
                                         const std::vector<double>& upper_bounds, const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  Series& s = Find(name, help, Kind::kHistogram, labels);
  if (s.histogram == nullptr) s.histogram = std::make_unique<Histogram>(upper_bounds);
  return *s.histogram;
}

int MetricsRegistry::RemoveSeries(absl::string_view name, absl::string_view value) {
  // A value's quotes are escaped, so `name="value"` between label
  // boundaries is that label and nothing else.
  const std::string pair = absl::StrCat(name, "=\"", Escape(value), "\"");
  absl::MutexLock lock(&mu_);
  int removed = 0;
  for (auto family = families_.begin(); family != families_.end();) {
    auto& series = family->second.series;
    for (auto it = series.begin(); it != series.end();) {
      const std::string& text = it->first;
      size_t at = text.find(pair);
      while (at != std::string::npos &&
             !((text[at - 1] == '{' || text[at - 1] == ',') &&
               (text[at + pair.size()] == ',' || text[at + pair.size()] == '}'))) {
        at = text.find(pair, at + 1);
      }
      if (at == std::string::npos) {
        ++it;
      } else {
        it = series.erase(it);
        ++removed;
      }
    }
    family = series.empty() ? families_.erase(family) : std::next(family);
  }
  return removed;
}

void MetricsRegistry::AddRefresh(std::function<void()> refresh) {
  absl::MutexLock lock(&mu_);
  refreshes_.push_back(std::move(refresh));
}

std::string MetricsRegistry::Exposition() {
  std::vector<std::function<void()>> refreshes;
  {
    absl::MutexLock lock(&mu_);
    refreshes = refreshes_;
  }
  for (const auto& refresh : refreshes) refresh();
  absl::MutexLock lock(&mu_);
  std::string text;
  for (const auto& [name, family] : families_) {
    const char* type = family.kind == Kind::kCounter ? "counter" : family.kind == Kind::kGauge ? "gauge" : "histogram";
    absl::StrAppend(&text, "# HELP ", name, " ", EscapeHelp(family.help), "\n# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, series] : family.series) {
      if (series.counter != nullptr) absl::StrAppend(&text, name, labels, " ", Number(series.counter->value()), "\n");
      if (series.gauge != nullptr) absl::StrAppend(&text, name, labels, " ", Number(series.gauge->value()), "\n");
      if (series.histogram == nullptr) continue;
      const Histogram& h = *series.histogram;
      const std::vector<uint64_t> counts = h.CumulativeCounts();
      // The labels' text is {…}: the le label joins it inside the braces.
      const std::string inner = labels.empty() ? "" : labels.substr(1, labels.size() - 2) + ",";
      for (size_t i = 0; i <= h.upper_bounds().size(); ++i) {
        const std::string le = i < h.upper_bounds().size() ? Number(h.upper_bounds()[i]) : "+Inf";
        absl::StrAppend(&text, name, "_bucket{", inner, "le=\"", le, "\"} ", counts[i], "\n");
      }
      absl::StrAppend(&text, name, "_sum", labels, " ", Number(h.sum()), "\n");
      absl::StrAppend(&text, name, "_count", labels, " ", counts.back(), "\n");
    }
  }
  return text;
}

}  // namespace shardline::common
