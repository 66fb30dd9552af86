#include "bench/bench_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::bench {
namespace {

std::string Format(const BenchReport::Value& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  const double d = std::get<double>(value);
  if (std::fabs(d) >= 1000 || d == std::floor(d)) return absl::StrFormat("%.0f", d);
  return absl::StrFormat("%.4g", d);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Integers exactly (sizes, counts); measurements to six significant digits,
// more than any of them is worth.
std::string JsonNumber(double d) {
  if (!std::isfinite(d)) return "null";
  if (d == std::floor(d) && std::fabs(d) < 0x1p53) return absl::StrFormat("%.0f", d);
  return absl::StrFormat("%.6g", d);
}

}  // namespace

std::string BenchReport::Table() const {
  std::vector<std::string> columns;
  for (const Row& row : rows_) {
    for (const auto& [key, value] : row) {
      if (std::find(columns.begin(), columns.end(), key) == columns.end()) columns.push_back(key);
    }
  }
  std::vector<std::vector<std::string>> cells(rows_.size() + 1);
  cells[0] = columns;
  for (size_t r = 0; r < rows_.size(); ++r) {
    for (const std::string& column : columns) {
      std::string text = "-";
      for (const auto& [key, value] : rows_[r]) {
        if (key == column) text = Format(value);
      }
      cells[r + 1].push_back(text);
    }
  }
  std::vector<size_t> widths(columns.size(), 0);
  for (const auto& line : cells) {
    for (size_t c = 0; c < line.size(); ++c) widths[c] = std::max(widths[c], line[c].size());
  }
  std::string out;
  for (const auto& line : cells) {
    for (size_t c = 0; c < line.size(); ++c) {
      absl::StrAppend(&out, c ? "  " : "", line[c], std::string(widths[c] - line[c].size(), ' '));
    }
    out += "\n";
  }
  return out;
}

std::string BenchReport::Json() const {
  std::string out = "[\n";
  for (size_t r = 0; r < rows_.size(); ++r) {
    out += "  {";
    for (size_t i = 0; i < rows_[r].size(); ++i) {
      const auto& [key, value] = rows_[r][i];
      absl::StrAppend(&out, i ? ", " : "", JsonString(key), ": ");
      if (const auto* s = std::get_if<std::string>(&value)) {
        out += JsonString(*s);
      } else {
        out += JsonNumber(std::get<double>(value));
      }
    }
    absl::StrAppend(&out, "}", r + 1 < rows_.size() ? ",\n" : "\n");
  }
  return out + "]\n";
}

absl::Status BenchReport::WriteJson(const std::string& path) const {
  std::ofstream file(path);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot write ", path));
  file << Json();
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat("write to ", path, " failed"));
  return absl::OkStatus();
}

absl::Status BenchReport::Publish(const std::string& json_path) const {
  std::printf("%s", Table().c_str());
  return json_path.empty() ? absl::OkStatus() : WriteJson(json_path);
}

double MedianSeconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> times;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace shardline::bench
