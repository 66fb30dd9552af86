#include "client/chrome_trace.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::client {
namespace {

// A JSON string literal of `text`.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string PositionName(const shardline::v1::PositionTrace& p) {
  return absl::StrCat("stage ", p.stage(), " \u00b7 replica ", p.replica(), " \u00b7 rank ", p.tensor_rank(), " (",
                      p.worker(), ")");
}

}  // namespace

std::string ChromeTraceJson(const shardline::v1::GetTraceResponse& trace) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& position : trace.positions()) {
    for (const auto& step : position.steps()) {
      for (const auto& event : step.events()) origin = std::min(origin, event.start_us());
    }
  }
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;
  std::vector<std::string> events;
  for (int i = 0; i < trace.positions_size(); ++i) {
    const shardline::v1::PositionTrace& position = trace.positions(i);
    const int pid = i + 1;
    events.push_back(absl::StrFormat(R"({"name": "process_name", "ph": "M", "pid": %d, "tid": 1, "args": {"name": %s}})",
                                     pid, Quoted(PositionName(position))));
    events.push_back(absl::StrFormat(
        R"({"name": "process_sort_index", "ph": "M", "pid": %d, "tid": 1, "args": {"sort_index": %d}})", pid, pid));
    for (const auto& step : position.steps()) {
      if (step.events().empty()) continue;
      const int64_t begin = step.events(0).start_us();
      int64_t end = begin;
      for (const auto& event : step.events()) end = std::max(end, event.start_us() + event.duration_us());
      events.push_back(absl::StrFormat(
          R"({"name": "step %d", "cat": "step", "ph": "X", "ts": %d, "dur": %d, "pid": %d, "tid": 1, )"
          R"("args": {"step": %d, "plan_epoch": %d}})",
          step.step(), begin - origin, end - begin, pid, step.step(), step.plan_epoch()));
      for (const auto& event : step.events()) {
        const std::string name =
            event.micro_batch() >= 0 ? absl::StrCat(event.name(), " ", event.micro_batch()) : event.name();
        events.push_back(absl::StrFormat(
            R"({"name": %s, "cat": %s, "ph": "X", "ts": %d, "dur": %d, "pid": %d, "tid": 1, )"
            R"("args": {"step": %d, "micro_batch": %d, "plan_epoch": %d}})",
            Quoted(name), Quoted(event.name()), event.start_us() - origin, event.duration_us(), pid, step.step(),
            event.micro_batch(), step.plan_epoch()));
      }
    }
  }
  std::string json = absl::StrFormat(
      "{\"displayTimeUnit\": \"ms\",\n \"otherData\": {\"job_id\": %s, \"origin_unix_us\": %d},\n \"traceEvents\": [\n",
      Quoted(trace.job_id()), origin);
  for (size_t i = 0; i < events.size(); ++i) absl::StrAppend(&json, "  ", events[i], i + 1 < events.size() ? ",\n" : "\n");
  absl::StrAppend(&json, "]}\n");
  return json;
}

}  // namespace shardline::client
