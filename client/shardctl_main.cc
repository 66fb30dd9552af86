// shardctl: the admin CLI.
//
//   shardctl [--coordinator=HOST:PORT] [-o table|json] COMMAND ...
//     get workers | get jobs | get links | describe job ID | plan SPEC [--explain]
//     submit SPEC [--init_weights=FILE]
//     probe [WORKER...]
//     watch ID | cancel ID | replan ID | delete ID | drain [--at_once] WORKER | undrain WORKER | export [--best] ID -o FILE
//     health [ADDRESS [SERVICE]] | trace ID [--steps=A:B] -o FILE | completion bash
//     (get workers -w: watch)
//
// Data goes to stdout, "Error: ..." to stderr. Exit codes: 0 ok, 1 failed
// (including a watched job that did not succeed), 2 cannot reach the
// coordinator, 3 invalid input.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "client/bash_completion.h"
#include "client/chrome_trace.h"
#include "client/health_check.h"
#include "client/job_progress.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/job_spec.h"
#include "common/transport_security.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7400", "the coordinator's address");
ABSL_FLAG(std::string, token_file, "",
          "a file holding the bearer token for the coordinator's Admin service (its --admin_tokens names it)");
ABSL_FLAG(std::string, o, "table", "output format: table or json (export, trace: the output file)");
ABSL_FLAG(bool, w, false, "get workers: keep watching, printing each worker whose row changes (as kubectl get -w)");
ABSL_FLAG(bool, watch, false, "the same as -w");
ABSL_FLAG(int64_t, watch_seconds, 0, "get workers -w: stop after this many seconds (0: until interrupted)");
ABSL_FLAG(bool, at_once, false,
          "drain: move the worker's job off it at once, from its committed step (default: at a step boundary a "
          "little ahead, checkpointed, so that nothing is replayed)");
ABSL_FLAG(bool, explain, false, "plan: each position's predicted compute, communication and memory, and the critical path");
ABSL_FLAG(std::string, init_weights, "",
          "submit: the job starts from the weights of this safetensors file (sent with it; from shardctl export "
          "or shardline-train, of the spec's model), not the seed's");
ABSL_FLAG(int64_t, probe_wait_s, 120, "probe: wait this long at most for the queued probes, then print the links");
ABSL_FLAG(bool, best, false,
          "export: the best validation pass's weights, which train.early_stopping keeps while the job runs (or "
          "after it was cancelled or failed), not the committed version's");
ABSL_FLAG(std::string, steps, "", "trace: the steps A:B (either end may be left out; default: all the coordinator keeps)");

namespace shardline::client {
namespace {

constexpr int kOk = 0, kFailed = 1, kUnreachable = 2, kInvalid = 3;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "Error: %s\n", std::string(status.message()).c_str());
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kUnreachable;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
      return kInvalid;
    default:
      return kFailed;
  }
}

int Usage(const std::string& problem) {
  std::fprintf(stderr,
               "Error: %s\nusage: shardctl [--coordinator=HOST:PORT] [-o table|json] "
               "get workers|jobs|links | probe [WORKER...] | describe job ID | plan SPEC | "
               "submit SPEC [--init_weights=FILE] | "
               "watch ID | cancel ID | replan ID | "
               "drain [--at_once] WORKER | undrain WORKER | export [--best] ID -o FILE | health [ADDRESS [SERVICE]] | "
               "trace ID [--steps=A:B] -o FILE | completion bash\n",
               problem.c_str());
  return kInvalid;
}

template <typename Message>
int Print(const absl::StatusOr<Message>& result, std::string (*table)(const Message&)) {
  if (!result.ok()) return Fail(result.status());
  if (absl::GetFlag(FLAGS_o) == "json") {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*result, &json, options);
    std::printf("%s", json.c_str());
  } else {
    std::printf("%s", table(*result).c_str());
  }
  return kOk;
}

// probe [WORKER...]: queue the probes, wait until none is left (or
// --probe_wait_s), print the links.
int Probe(AdminClient& admin, const std::vector<std::string>& workers) {
  absl::StatusOr<shardline::v1::ProbeLinksResponse> queued = admin.ProbeLinks(workers);
  if (!queued.ok()) return Fail(queued.status());
  std::fprintf(stderr, "%d link directions queued; they are probed as their workers go idle\n", queued->queued());
  const absl::Time give_up = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_probe_wait_s));
  for (;;) {
    absl::StatusOr<shardline::v1::ListLinksResponse> links = admin.ListLinks();
    if (!links.ok()) return Fail(links.status());
    if (links->pending_probes() == 0 || absl::Now() > give_up) {
      const int status = Print(links, &LinksTable);
      if (links->pending_probes() > 0) {
        std::fprintf(stderr, "Error: %d directions still queued after %ld s (busy workers probe once idle)\n",
                     links->pending_probes(), static_cast<long>(absl::GetFlag(FLAGS_probe_wait_s)));
        return kFailed;
      }
      return status;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
}

std::string StatusLine(const shardline::v1::JobStatus& s) { return ProgressLine(s) + "\n"; }

std::string DeletedLine(const shardline::v1::DeleteJobResponse& r) {
  return absl::StrFormat("deleted %s (%s; %.1f MB of checkpoint freed)\n", r.job_id(),
                         absl::AsciiStrToLower(shardline::v1::JobState_Name(r.state())), r.freed_bytes() / 1e6);
}

int Watch(AdminClient& admin, const std::string& job_id) {
  const bool tty = isatty(fileno(stdout));
  absl::StatusOr<shardline::v1::JobStatus> last = admin.Watch(job_id, [&](const auto& status) {
    if (absl::GetFlag(FLAGS_o) == "json") {
      std::string json;
      (void)google::protobuf::util::MessageToJsonString(status, &json);
      std::printf("%s\n", json.c_str());
    } else {
      std::printf(tty ? "\r\033[K%s" : "%s\n", ProgressLine(status).c_str());
    }
    std::fflush(stdout);
  });
  if (tty && absl::GetFlag(FLAGS_o) != "json") std::printf("\n");
  if (!last.ok()) return Fail(last.status());
  return last->state() == shardline::v1::SUCCEEDED ? kOk : kFailed;
}

// get workers -w: the table, then a row for each worker that appears or
// changes (polled twice a second), until interrupted or --watch_seconds.
int WatchWorkers(AdminClient& admin) {
  const bool json = absl::GetFlag(FLAGS_o) == "json";
  const int64_t seconds = absl::GetFlag(FLAGS_watch_seconds);
  const absl::Time until = seconds > 0 ? absl::Now() + absl::Seconds(seconds) : absl::InfiniteFuture();
  std::map<std::string, std::string> shown;  // by worker id: what was printed
  bool first = true;
  while (absl::Now() < until) {
    absl::StatusOr<shardline::v1::ListWorkersResponse> workers = admin.ListWorkers();
    if (!workers.ok()) return Fail(workers.status());
    shardline::v1::ListWorkersResponse changed;
    for (const shardline::v1::WorkerStatus& w : workers->workers()) {
      std::string text;
      (void)google::protobuf::util::MessageToJsonString(w, &text);
      if (shown[w.worker_id()] != text) {
        shown[w.worker_id()] = text;
        *changed.add_workers() = w;
      }
    }
    for (const shardline::v1::WorkerStatus& w : changed.workers()) {
      if (json) std::printf("%s\n", shown[w.worker_id()].c_str());
    }
    if (!json && (first || changed.workers_size() > 0)) {
      std::string table = WorkersTable(changed);
      // After the first table, the rows without the header (as kubectl -w).
      if (!first) table = table.substr(table.find('\n') + 1);
      std::printf("%s", table.c_str());
    }
    first = false;
    std::fflush(stdout);
    absl::SleepFor(std::min(absl::Milliseconds(500), until - absl::Now()));
  }
  return kOk;
}

int Run(const std::vector<std::string>& args) {
  if (args.empty()) return Usage("no command");
  const std::string format = absl::GetFlag(FLAGS_o);
  absl::StatusOr<std::shared_ptr<common::TransportSecurity>> security = common::TransportSecurity::FromFlags();
  if (!security.ok()) return Usage(std::string(security.status().message()));
  std::string token;
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    absl::StatusOr<std::string> read = common::ReadFileBounded(absl::GetFlag(FLAGS_token_file), 4096);
    if (!read.ok()) return Usage(absl::StrCat("--token_file: ", read.status().message()));
    token = std::string(absl::StripAsciiWhitespace(*read));
  }
  AdminClient admin(absl::GetFlag(FLAGS_coordinator), absl::Seconds(10), (*security)->ChannelCredentials(), token);
  const std::string& command = args[0];
  if (command != "export" && command != "trace" && format != "table" && format != "json") {
    return Usage("-o must be table or json");
  }
  if (absl::GetFlag(FLAGS_best) && command != "export") return Usage("--best is for export");
  if (command == "get" && args.size() == 2 && args[1] == "workers") {
    if (absl::GetFlag(FLAGS_w) || absl::GetFlag(FLAGS_watch)) return WatchWorkers(admin);
    return Print(admin.ListWorkers(), &WorkersTable);
  }
  if (command == "get" && args.size() == 2 && args[1] == "jobs") {
    return Print(admin.ListJobs(), +[](const shardline::v1::ListJobsResponse& jobs) {
      return JobsTable(jobs, absl::Now());
    });
  }
  if (command == "get" && args.size() == 2 && args[1] == "links") return Print(admin.ListLinks(), &LinksTable);
  if (command == "probe") return Probe(admin, {args.begin() + 1, args.end()});
  if (command == "describe" && args.size() == 3 && args[1] == "job") {
    return Print(admin.Get(args[2]), &DescribeJob);
  }
  if ((command == "plan" || command == "submit") && args.size() == 2) {
    absl::StatusOr<shardline::v1::JobSpec> spec = common::LoadJobSpec(args[1]);
    if (!spec.ok()) return Fail(spec.status());
    if (command == "plan") return Print(admin.Plan(*spec), absl::GetFlag(FLAGS_explain) ? &ExplainPlan : &PlanTable);
    const std::string weights = absl::GetFlag(FLAGS_init_weights);
    if (!weights.empty()) return Print(admin.SubmitWithWeights(*spec, weights), &StatusLine);
    return Print(admin.Submit(*spec), &StatusLine);
  }
  if (command == "watch" && args.size() == 2) return Watch(admin, args[1]);
  if (command == "cancel" && args.size() == 2) return Print(admin.Cancel(args[1]), &StatusLine);
  if (command == "replan" && args.size() == 2) return Print(admin.Replan(args[1]), &StatusLine);
  if (command == "delete" && args.size() == 2) return Print(admin.Delete(args[1]), &DeletedLine);
  if ((command == "drain" || command == "undrain") && args.size() == 2) {
    if (command == "undrain" && absl::GetFlag(FLAGS_at_once)) return Usage("--at_once is for drain");
    return Print(admin.Drain(args[1], command == "undrain", absl::GetFlag(FLAGS_at_once)), &WorkerTable);
  }
  if (command == "export" && args.size() == 2) {
    if (format == "table" || format == "json") return Usage("export needs -o FILE");
    absl::StatusOr<int64_t> bytes = admin.ExportTo(args[1], format, absl::GetFlag(FLAGS_best));
    if (!bytes.ok()) return Fail(bytes.status());
    std::printf("wrote %lld bytes to %s\n", static_cast<long long>(*bytes), format.c_str());
    return kOk;
  }
  if (command == "trace" && args.size() == 2) {
    if (format == "table" || format == "json") return Usage("trace needs -o FILE");
    int64_t first = 0, last = 0;
    const std::string steps = absl::GetFlag(FLAGS_steps);
    const size_t colon = steps.find(':');
    if (!steps.empty() && (colon == std::string::npos ||
                           (colon > 0 && !absl::SimpleAtoi(steps.substr(0, colon), &first)) ||
                           (colon + 1 < steps.size() && !absl::SimpleAtoi(steps.substr(colon + 1), &last)) ||
                           first < 0 || last < 0 || (last > 0 && first > last))) {
      return Usage("--steps must be A:B, A:, :B or empty (steps from 1)");
    }
    absl::StatusOr<shardline::v1::GetTraceResponse> trace = admin.Trace(args[1], first, last);
    if (!trace.ok()) return Fail(trace.status());
    size_t steps_written = 0;
    for (const auto& p : trace->positions()) steps_written += static_cast<size_t>(p.steps_size());
    if (steps_written == 0) return Fail(absl::NotFoundError(absl::StrCat("no traced steps of ", args[1], " there")));
    if (absl::Status s = common::WriteFileAtomically(format, ChromeTraceJson(*trace)); !s.ok()) return Fail(s);
    std::printf("wrote %d positions' steps to %s (open it in ui.perfetto.dev or chrome://tracing)\n",
                trace->positions_size(), format.c_str());
    return kOk;
  }
  if (command == "completion" && args.size() == 2 && args[1] == "bash") {
    std::printf("%s", BashCompletion(common::FlagNames()).c_str());
    return kOk;
  }
  if (command == "health" && args.size() <= 3) {
    // Any daemon's health service (default: the coordinator's), for
    // container health checks and scripts: exit 0 only when SERVING.
    const std::string address = args.size() >= 2 ? args[1] : absl::GetFlag(FLAGS_coordinator);
    absl::StatusOr<ServingStatus> status =
        CheckHealth(address, args.size() == 3 ? args[2] : "", absl::Seconds(5), (*security)->ChannelCredentials());
    if (!status.ok()) return Fail(status.status());
    const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status);
    std::printf(format == "json" ? "{\"status\": \"%s\"}\n" : "%s\n", name.c_str());
    return *status == grpc::health::v1::HealthCheckResponse::SERVING ? kOk : kFailed;
  }
  return Usage("unknown command or wrong arguments");
}

}  // namespace
}  // namespace shardline::client

int main(int argc, char** argv) {
  std::vector<std::string> positional = shardline::common::InitProcess(
      argc, argv, "shardctl [--coordinator=HOST:PORT] [-o table|json] COMMAND ...");
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  return shardline::client::Run(args);
}
