// BenchReport collects benchmark rows (flat string/number fields), prints
// them as an aligned table and writes them as a JSON array. Shared by the
// benchmarks in bench/. Not thread-safe.
#ifndef SHARDLINE_BENCH_BENCH_REPORT_H_
#define SHARDLINE_BENCH_BENCH_REPORT_H_

#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "glog/logging.h"

// Benchmarks stop at the first unexpected error: a number measured past one
// would mean nothing.
#define BENCH_CHECK_OK(expr)                          \
  do {                                                \
    const ::absl::Status bench_status_ = (expr);      \
    CHECK(bench_status_.ok()) << bench_status_;       \
  } while (false)

namespace shardline::bench {

class BenchReport {
 public:
  using Value = std::variant<std::string, double>;
  using Row = std::vector<std::pair<std::string, Value>>;

  void Add(Row row) { rows_.push_back(std::move(row)); }
  const std::vector<Row>& rows() const { return rows_; }

  // One line per row, columns in the order first seen.
  std::string Table() const;
  // [{"key": value, ...}, ...]
  std::string Json() const;
  absl::Status WriteJson(const std::string& path) const;
  // Prints the table to stdout and, when `json_path` is not empty, writes the JSON there.
  absl::Status Publish(const std::string& json_path) const;

 private:
  std::vector<Row> rows_;
};

// Median wall time in seconds of `reps` calls of `fn`, after one warm-up call.
double MedianSeconds(int reps, const std::function<void()>& fn);

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_BENCH_REPORT_H_
