// bench_coordinator: what a worker's heartbeat costs the coordinator as the
// cluster grows. A coordinator (its gRPC service on 127.0.0.1:0, a state
// directory of its own) registers `workers` workers, each a host of its
// own, so every link between them is queued and never measured, and gives
// every one a job: each heartbeat then finds a check of a link with a busy
// end due (LinkTable::CheckDue) and none it may run (never between two
// busy workers). Timed, in the same run: a heartbeat round trip (the
// median of `heartbeats`, one worker after another) and a listing of every
// worker record (WorkerRegistry::List), what each such heartbeat paid
// before the registry kept which workers probes may use (Availability);
// and a registration's round trip (the median of the last tenth's: its
// links to every worker queued).
//
//   bench_coordinator [--workers=10,100,1000] [--heartbeats=2000] [--json=FILE]
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_report.h"
#include "common/grpc_metadata.h"
#include "common/init.h"
#include "glog/logging.h"
#include "server/coordinator_service.h"
#include "server/coordinator_store.h"
#include "server/job_manager.h"
#include "server/weight_store.h"
#include "server/worker_registry.h"

ABSL_FLAG(std::string, workers, "10,100,1000", "cluster sizes");
ABSL_FLAG(int, heartbeats, 2000, "heartbeats timed per size (median reported)");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");

namespace shardline::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BenchSize(int workers, int heartbeats, BenchReport& report) {
  char pattern[] = "/tmp/bench_coordinator.XXXXXX";
  CHECK(mkdtemp(pattern) != nullptr) << "mkdtemp";
  const std::string dir = pattern;
  std::unique_ptr<server::WeightStore> weights = std::move(server::WeightStore::Open(dir)).value();
  std::unique_ptr<server::CoordinatorStore> store =
      std::move(server::CoordinatorStore::Open(dir + "/coordinator.db")).value();
  server::WorkerRegistry registry(absl::Minutes(10));
  server::CoordinatorService coordinator(registry);
  server::JobManager jobs(registry, *weights, *store, [&](const std::string& w, shardline::v1::Assignment a) {
    coordinator.Deliver(w, std::move(a));
  });
  coordinator.set_jobs(&jobs);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  CHECK(server != nullptr && port > 0) << "the coordinator's service did not start";
  auto stub = shardline::v1::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  std::vector<std::pair<std::string, std::string>> registered;  // (id, secret)
  std::vector<double> registrations;  // the last tenth's round trips
  for (int i = 0; i < workers; ++i) {
    grpc::ClientContext context;
    shardline::v1::RegisterRequest request;
    request.set_name(absl::StrCat("w", i));
    request.mutable_capabilities()->set_listen_address(absl::StrCat("10.", i / 250, ".", i % 250, ".1:7401"));
    request.mutable_capabilities()->set_gemm_flops(1e10);
    request.mutable_capabilities()->set_memory_bytes(int64_t{8} << 30);
    shardline::v1::RegisterResponse response;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = stub->Register(&context, request, &response);
    if (i >= workers - std::max(1, workers / 10)) {
      registrations.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    CHECK(status.ok()) << status.error_message();
    registered.emplace_back(response.worker_id(), response.worker_secret());
  }
  for (const auto& [id, secret] : registered) registry.SetJob(id, "bench-job");

  std::vector<double> round_trips;
  int targets = 0;
  for (int h = 0; h < heartbeats; ++h) {
    const auto& [id, secret] = registered[static_cast<size_t>(h) % registered.size()];
    grpc::ClientContext context;
    context.AddMetadata(common::kWorkerSecretKey, secret);
    shardline::v1::HeartbeatRequest request;
    request.set_worker_id(id);
    shardline::v1::HeartbeatResponse response;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = stub->Heartbeat(&context, request, &response);
    round_trips.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    CHECK(status.ok()) << status.error_message();
    targets += response.probe_targets_size();
  }
  CHECK_EQ(targets, 0) << "a check between two busy workers was handed out";
  CHECK(jobs.links().CheckDue("w0")) << "no check is due: nothing measured";
  const double list_us = Median([&] {
    std::vector<double> v;
    for (int r = 0; r < 21; ++r) {
      const auto start = std::chrono::steady_clock::now();
      CHECK_EQ(registry.List().size(), static_cast<size_t>(workers));
      v.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    return v;
  }());
  const double heartbeat_us = Median(round_trips);
  report.Add({{"workers", static_cast<double>(workers)},
              {"queued_links", static_cast<double>(jobs.links().pending())},
              {"register_us", Median(registrations)},
              {"heartbeat_us", heartbeat_us},
              {"list_us", list_us},
              {"list_per_heartbeat", list_us / heartbeat_us}});
  server->Shutdown();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "what a worker's heartbeat costs the coordinator as the cluster grows");
  shardline::bench::BenchReport report;
  for (absl::string_view size : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty())) {
    shardline::bench::BenchSize(std::stoi(std::string(size)), absl::GetFlag(FLAGS_heartbeats), report);
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}
