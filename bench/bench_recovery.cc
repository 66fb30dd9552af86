// bench_recovery: how fast a job gets over a worker killed with SIGKILL, on
// a cluster of the real binaries on loopback (client/LocalCluster): a
// coordinator and workers as processes, the default model
// (examples/addition.json's) training, one position killed between two
// checkpoints. For each scenario, the seconds from the kill until the
// coordinator acts on it (detect_s: the job leaves RUNNING; the target is
// the lease, and the bench fails after ten, at least 10 s), from then
// until the job has trained a step again at its new epoch (resume_s: the
// target is 10 s), and the steps it replays (those
// completed after its committed version), and where the restarted
// positions loaded their state from (their own memory, a twin's, the
// coordinator's disk; --d_model scales the state):
//   standby  p = 3: a spare worker takes the lost position;
//   twin     p = 2, d = 2: a spare takes the lost position, whose replica
//            twin holds the same shard;
//   replan   p = 3, no spare: after a lease it re-plans onto 2 stages;
//   fewer_replicas  p = 1, d = 2, no spare: after a lease it re-plans onto
//            one replica running both replicas' micro-batch groups.
// Each row also has the job's step time before the kill and a few steps
// after it trains again (the re-planned layouts run slower).
//
//   bench_recovery [--scenarios=standby,twin,replan,fewer_replicas] [--lease_ms=3000] [--kill_after=25] [--d_model=128]
//                  [--json=FILE]
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_report.h"
#include "client/admin_client.h"
#include "client/local_cluster.h"
#include "common/init.h"
#include "common/job_spec.h"

ABSL_FLAG(std::string, scenarios, "standby,twin,replan,fewer_replicas", "which recoveries to measure");
ABSL_FLAG(int64_t, lease_ms, 3000, "the coordinator's lease (its default: 3000)");
ABSL_FLAG(int, checkpoint_every, 50, "checkpoint.every_steps of the job");
ABSL_FLAG(int, kill_after, 25, "steps after a committed checkpoint at which the worker is killed");
ABSL_FLAG(int, d_model, 128, "the model's width (the default model's: 128)");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");

namespace shardline::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Scenario {
  std::string name;
  int stages;
  int replicas;
  int spares;
  int victim;  // position (replica · p + stage) killed
};

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

shardline::v1::JobSpec Spec(const Scenario& s) {
  auto spec = common::ParseJobSpec(R"({"name": "recovery",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 16, "d_model": 128, "n_heads": 4, "n_layers": 4},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 100000, "global_batch": 64, "micro_batches": 8, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.001, "weight_decay": 0.1, "warmup_steps": 100}},
    "parallel": {"schedule": "1f1b"}})");
  BENCH_CHECK_OK(spec.status());
  spec->mutable_parallel()->set_pipeline_stages(s.stages);
  spec->mutable_parallel()->set_data_parallel(s.replicas);
  spec->mutable_train()->set_micro_batches(8 / s.replicas);
  spec->mutable_model()->set_d_model(absl::GetFlag(FLAGS_d_model));
  spec->mutable_checkpoint()->set_every_steps(absl::GetFlag(FLAGS_checkpoint_every));
  return *spec;
}

// Polls the job every 5 ms until `done` (at most `seconds`); its last status.
shardline::v1::JobStatus Poll(client::AdminClient& admin, const std::string& job, double seconds,
                              const std::function<bool(const shardline::v1::JobStatus&)>& done) {
  shardline::v1::JobStatus last;
  const Clock::time_point start = Clock::now();
  while (Since(start) < seconds) {
    absl::StatusOr<shardline::v1::JobStatus> status = admin.Get(job);
    if (status.ok()) {
      last = *status;
      if (done(last)) return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  LOG(FATAL) << "job " << job << " did not get there in " << seconds << " s: " << last.DebugString();
  return last;
}

BenchReport::Row Measure(const Scenario& s) {
  const int workers = s.stages * s.replicas + s.spares;
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / workers);
  const int64_t lease_ms = absl::GetFlag(FLAGS_lease_ms);
  client::LocalCluster cluster;
  // Alike workers on one host, reported alike (measured at once, their
  // rates differ by noise, and the planner would cut again for the spare).
  cluster.set_worker_flags({"--gemm_flops=1e11"});
  BENCH_CHECK_OK(cluster.Start(workers, "cpu", threads, lease_ms));
  client::AdminClient admin(cluster.address());
  absl::StatusOr<shardline::v1::JobStatus> job = admin.Submit(Spec(s));
  BENCH_CHECK_OK(job.status());
  const std::string id = job->job_id();
  const int every = absl::GetFlag(FLAGS_checkpoint_every), after = absl::GetFlag(FLAGS_kill_after);
  const shardline::v1::JobStatus before = Poll(admin, id, 300, [&](const shardline::v1::JobStatus& j) {
    return j.committed_step() >= every && j.step() >= j.committed_step() + after;
  });
  const std::string victim = before.stages(s.victim).worker();  // "local-<i>"
  int index = 0;
  CHECK(absl::SimpleAtoi(victim.substr(victim.rfind('-') + 1), &index)) << victim;

  const Clock::time_point killed = Clock::now();
  cluster.KillWorker(index);
  int64_t reached = before.step();  // the last step completed before the job noticed
  // A coordinator that has not noticed in ten leases never will.
  const double notice_s = std::max(10.0, lease_ms / 100.0);
  const shardline::v1::JobStatus noticed = Poll(admin, id, notice_s, [&](const shardline::v1::JobStatus& j) {
    if (j.state() == shardline::v1::RUNNING && j.plan_epoch() == before.plan_epoch()) {
      reached = std::max(reached, j.step());
      return false;
    }
    return true;
  });
  const double detect_s = Since(killed);
  const Clock::time_point detected = Clock::now();
  const int64_t committed = noticed.committed_step();
  const shardline::v1::JobStatus resumed = Poll(admin, id, 120, [&](const shardline::v1::JobStatus& j) {
    return j.state() == shardline::v1::RUNNING && j.plan_epoch() != before.plan_epoch() && j.step() > committed;
  });
  const double resume_s = Since(detected);
  // Its pace on the new layout, a few steps in (the first step of an epoch
  // warms up).
  const shardline::v1::JobStatus settled = Poll(admin, id, 120, [&](const shardline::v1::JobStatus& j) {
    return j.plan_epoch() != resumed.plan_epoch() || j.step() >= resumed.step() + 10;
  });
  BENCH_CHECK_OK(admin.Cancel(id).status());
  int own = 0, twin = 0, coordinator = 0;
  for (const auto& stage : resumed.stages()) {
    own += stage.resumed_from() == "its own memory";
    twin += absl::StartsWith(stage.resumed_from(), "its twin");
    coordinator += stage.resumed_from() == "the coordinator";
  }
  LOG(INFO) << s.name << ": killed " << victim << " at step " << reached << "; noticed after " << detect_s
            << " s: " << noticed.message() << "; training again after " << resume_s << " s on "
            << resumed.stages_size() << " positions";
  return {{"scenario", s.name},
          {"stages", static_cast<double>(s.stages)},
          {"data_parallel", static_cast<double>(s.replicas)},
          {"workers", static_cast<double>(workers)},
          {"lease_s", lease_ms / 1e3},
          {"detect_s", detect_s},
          {"resume_s", resume_s},
          {"recovery_s", detect_s + resume_s},
          {"killed_at_step", static_cast<double>(reached)},
          {"committed_step", static_cast<double>(committed)},
          {"replayed_steps", static_cast<double>(reached - committed)},
          {"positions_after", static_cast<double>(resumed.stages_size())},
          {"step_s_before", before.step_seconds()},
          {"step_s_after", settled.step_seconds()},
          {"state_from_own_memory", static_cast<double>(own)},
          {"state_from_twin", static_cast<double>(twin)},
          {"state_from_coordinator", static_cast<double>(coordinator)}};
}

int Main() {
  const std::vector<Scenario> all = {
      {"standby", 3, 1, 1, 1}, {"twin", 2, 2, 1, 3}, {"replan", 3, 1, 0, 1}, {"fewer_replicas", 1, 2, 0, 1}};
  BenchReport report;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_scenarios), ',', absl::SkipEmpty())) {
    auto it = std::find_if(all.begin(), all.end(), [&](const Scenario& s) { return s.name == name; });
    if (it == all.end()) {
      std::fprintf(stderr, "Error: unknown scenario '%s' (standby, twin, replan, fewer_replicas)\n",
                   std::string(name).c_str());
      return 3;
    }
    report.Add(Measure(*it));
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv,
                                 "bench_recovery [--scenarios=standby,twin,replan,fewer_replicas] [--lease_ms=N] "
                                 "[--json=FILE]");
  return shardline::bench::Main();
}
