#include "common/metrics_log.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::common {
namespace {

std::string Number(double v) { return std::isfinite(v) ? absl::StrFormat("%.17g", v) : "null"; }

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  return absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Open(const std::string& path, bool append) {
  auto log = std::make_unique<MetricsLog>();
  log->path_ = path;
  if (path.empty()) return log;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  log->file_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!log->file_) return absl::InvalidArgumentError(absl::StrCat("cannot write metrics to ", path));
  return log;
}

std::string MetricsLog::StepJson(const StepMetrics& m) {
  return absl::StrCat("{\"step\": ", m.step, ", \"loss\": ", Number(m.loss), ", \"lr\": ",
                      Number(m.lr), ", \"tokens_per_s\": ", absl::StrFormat("%.1f", m.tokens_per_s),
                      ", \"grad_norm\": ", Number(m.grad_norm), "}");
}

std::string MetricsLog::EvalJson(const EvalMetrics& m) {
  std::string metric = m.exact_match
                           ? absl::StrCat("\"accuracy\": ", Number(m.accuracy))
                           : absl::StrCat("\"val_loss\": ", Number(m.val_loss),
                                          std::isnan(m.bits_per_byte)
                                              ? ""
                                              : absl::StrCat(", \"bits_per_byte\": ", Number(m.bits_per_byte)));
  // train_seconds only when this process trained (not for --eval_weights).
  const std::string seconds =
      m.train_seconds > 0 ? absl::StrFormat(", \"train_seconds\": %.1f", m.train_seconds) : "";
  return absl::StrCat("{\"eval\": true, \"step\": ", m.step, ", ", metric, ", \"examples\": ",
                      m.examples, seconds, "}");
}

absl::Status MetricsLog::WriteLine(const std::string& line) {
  if (path_.empty()) return absl::OkStatus();
  file_ << line << '\n';
  file_.flush();
  if (!file_) return absl::DataLossError(absl::StrCat("writing metrics to ", path_, " failed"));
  return absl::OkStatus();
}

std::string ProgressLine(const StepMetrics& m, int64_t total_steps, double eta_seconds) {
  const double tps = m.tokens_per_s;
  const std::string rate = tps >= 1e6   ? absl::StrFormat("%.2fM", tps / 1e6)
                           : tps >= 1e3 ? absl::StrFormat("%.1fk", tps / 1e3)
                                        : absl::StrFormat("%.0f", tps);
  const int width = static_cast<int>(std::to_string(total_steps).size());
  return absl::StrFormat("step %*d/%d  loss %.4f  lr %.2e  %s tok/s  ETA %s", width, m.step,
                         total_steps, m.loss, m.lr, rate, Duration(eta_seconds));
}

std::string EvalLine(const EvalMetrics& m) {
  if (m.exact_match) return absl::StrFormat("held-out exact match: %.2f%% of %d problems", 100.0 * m.accuracy, m.examples);
  const std::string bits =
      std::isnan(m.bits_per_byte) ? "" : absl::StrFormat(" (%.3f bits per byte)", m.bits_per_byte);
  return absl::StrFormat("validation loss %.4f%s over %d windows", m.val_loss, bits, m.examples);
}

}  // namespace shardline::common
