// MetricsLog writes training metrics as JSON Lines: one object per step
// record and one evaluation record at the end. shardline-train and the
// distributed launcher write the same records, so their files compare line
// by line. Losses are printed with 17 significant digits (exact doubles).
// Not thread-safe.
#ifndef SHARDLINE_COMMON_METRICS_LOG_H_
#define SHARDLINE_COMMON_METRICS_LOG_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shardline::common {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double tokens_per_s = 0.0;
  double grad_norm = 0.0;
};

struct EvalMetrics {
  int64_t step = 0;
  bool exact_match = false;  // accuracy when true, else val_loss and bits_per_byte
  double accuracy = 0.0;
  double val_loss = 0.0;
  double bits_per_byte = 0.0;  // NaN: not bytes (left out)
  int64_t examples = 0;
  double train_seconds = 0.0;
};

class MetricsLog {
 public:
  // An empty path gives a log that writes nothing. `append` keeps what the
  // file already holds.
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Open(const std::string& path,
                                                          bool append = false);

  static std::string StepJson(const StepMetrics& m);
  static std::string EvalJson(const EvalMetrics& m);
  absl::Status Write(const StepMetrics& m) { return WriteLine(StepJson(m)); }
  absl::Status Write(const EvalMetrics& m) { return WriteLine(EvalJson(m)); }

 private:
  absl::Status WriteLine(const std::string& line);
  std::string path_;
  std::ofstream file_;
};

// One progress line: "step 120/1500  loss 1.2345  lr 9.8e-04  12.3k tok/s  ETA 2m03s".
std::string ProgressLine(const StepMetrics& m, int64_t total_steps, double eta_seconds);
// What an evaluation found: "held-out exact match: 97.00% of 993 problems",
// or "validation loss 1.2345 (1.781 bits per byte) over 19 windows".
std::string EvalLine(const EvalMetrics& m);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_METRICS_LOG_H_
