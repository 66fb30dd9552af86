#include "client/job_progress.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace shardline::client {
namespace {

shardline::v1::JobStatus Running() {
  shardline::v1::JobStatus s;
  s.set_job_id("job-7");
  s.set_name("addition");
  s.set_state(shardline::v1::RUNNING);
  s.set_step(300);
  s.set_total_steps(1200);
  s.set_loss(0.123456);
  s.set_tokens_per_s(16234);
  s.set_committed_step(200);
  for (int i = 0; i < 2; ++i) {
    auto* st = s.add_stages();
    st->set_stage(i);
    st->set_worker(i == 0 ? "gpu-a" : "cpu-long-name");
    st->set_unit_begin(i * 3);
    st->set_unit_end(i * 3 + 3);
    st->set_busy_fraction(i == 0 ? 0.5 : 0.875);
    st->set_peak_slots(2 - i);
    st->set_link_peak_bytes(i == 0 ? 3 << 19 : 0);  // 1.5 MiB
    st->set_minor_faults_per_gib(1234.4);
    st->set_step_seconds(i == 0 ? 0.25 : 0.5);
    if (i == 1) {
      st->set_checkpoint_seconds(0.054);
      st->set_checkpoint_wait_seconds(1.5);
    }
  }
  return s;
}

TEST(JobProgressTest, TheProgressLineShowsTheBarLossRateAndBusyStages) {
  EXPECT_EQ(ProgressLine(Running()),
            "job-7 RUNNING [#####---------------] 300/1200  loss 0.1235  16.2k tok/s  busy 50% 88%");
  shardline::v1::JobStatus pending;
  pending.set_job_id("job-8");
  pending.set_state(shardline::v1::PENDING);
  pending.set_total_steps(10);
  pending.set_message("waiting for 3 idle workers");
  EXPECT_EQ(ProgressLine(pending), "job-8 PENDING [--------------------] 0/10  (waiting for 3 idle workers)");
  shardline::v1::JobStatus validated = Running();
  validated.set_val_step(300);
  validated.set_val_loss(0.25);
  EXPECT_EQ(ProgressLine(validated),
            "job-7 RUNNING [#####---------------] 300/1200  loss 0.1235  val 0.2500  16.2k tok/s  busy 50% 88%");
  validated.set_val_windows(993);
  validated.set_val_matches(966);  // exact match: the accuracy in its place
  EXPECT_EQ(ProgressLine(validated),
            "job-7 RUNNING [#####---------------] 300/1200  loss 0.1235  val 97.3%  16.2k tok/s  busy 50% 88%");
}

TEST(JobProgressTest, DescribeShowsOneAlignedRowPerStage) {
  std::string text = DescribeJob(Running());
  EXPECT_NE(text.find("Committed:  step 200\n"), std::string::npos) << text;
  shardline::v1::JobStatus sized = Running();
  sized.set_checkpoint_bytes(305'240'000);
  EXPECT_NE(DescribeJob(sized).find("Committed:  step 200 (305.2 MB)\n"), std::string::npos) << DescribeJob(sized);
  sized.set_checkpoint_bytes(12'100'000'000);
  EXPECT_NE(DescribeJob(sized).find("Committed:  step 200 (12.1 GB)\n"), std::string::npos) << DescribeJob(sized);
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  size_t header = 0;
  while (header < lines.size() && lines[header].rfind("STAGE", 0) != 0) ++header;
  ASSERT_LT(header + 2, lines.size()) << text;
  EXPECT_EQ(lines[header],
            "STAGE  WORKER         UNITS   BUSY  STEP S  PEAK MICRO-BATCHES  LINK PEAK MIB  MINOR FAULTS/GIB RECEIVED  "
            "CHECKPOINT S (WAIT)");
  EXPECT_EQ(lines[header + 1],
            "0      gpu-a          [0, 3)  50%   0.250   2                   1.5            1234                       -");
  EXPECT_EQ(lines[header + 2],
            "1      cpu-long-name  [3, 6)  88%   0.500   1                   0.0            1234                       "
            "0.054 (1.500)");
  EXPECT_EQ(text.find("Now:"), std::string::npos) << "nothing from heartbeats: no section";
  EXPECT_EQ(text.find("STATE FROM"), std::string::npos) << "not a restart: no column";
  EXPECT_EQ(text.find("Weighed:"), std::string::npos) << "no move weighed: no line";
}

TEST(JobProgressTest, DescribeSaysTheLastMoveWeighedAndNotMade) {
  shardline::v1::JobStatus s = Running();
  s.set_message("re-planned from step 31 (its steps slowed)");
  s.set_weighed("at step 40: link a1 -> a2 carries 940 Mbit/s again; no layout is clearly faster");
  const std::string text = DescribeJob(s);
  EXPECT_NE(text.find("Message:    re-planned from step 31 (its steps slowed)\nWeighed:    at step 40: link a1 -> a2 "
                      "carries 940 Mbit/s again; no layout is clearly faster\n"),
            std::string::npos)
      << text;
}

// AGE as kubectl shows it, from when the job was submitted; describe gives
// the three times in UTC.
TEST(JobProgressTest, JobsShowTheirAgeAndDescribeTheirTimes) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  shardline::v1::ListJobsResponse jobs;
  const std::vector<std::pair<int64_t, std::string>> ages = {
      {0, "0s"}, {59, "59s"}, {60, "1m"}, {3599, "59m"}, {3600, "1h"}, {86399, "23h"}, {3 * 86400 + 5, "3d"}};
  for (const auto& [seconds, age] : ages) {
    shardline::v1::JobStatus* j = jobs.add_jobs();
    j->set_job_id(absl::StrCat("job-", seconds));
    j->set_submitted_at(1'800'000'000.0 - static_cast<double>(seconds));
  }
  jobs.add_jobs()->set_job_id("job-old");  // saved by a coordinator that kept no times
  jobs.mutable_jobs(0)->set_checkpoint_bytes(4'500'000);
  const std::vector<std::string> lines = absl::StrSplit(JobsTable(jobs, now), '\n');
  ASSERT_EQ(lines.size(), ages.size() + 3) << "header, rows, the last newline";
  const size_t column = lines[0].find("AGE");
  ASSERT_NE(column, std::string::npos) << lines[0];
  for (size_t i = 0; i < ages.size(); ++i) {
    EXPECT_EQ(lines[i + 1].substr(column, ages[i].second.size() + 1), ages[i].second + " ") << lines[i + 1];
  }
  EXPECT_EQ(lines[ages.size() + 1].substr(column, 2), "- ") << lines[ages.size() + 1];
  const size_t size_column = lines[0].find("CHECKPOINT");
  ASSERT_NE(size_column, std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].substr(size_column, 7), "4.5 MB ") << lines[1];
  EXPECT_EQ(lines[2].substr(size_column, 2), "- ") << "nothing committed: " << lines[2];
  // VAL: the latest validation pass, its loss or the share right.
  jobs.mutable_jobs(0)->set_val_step(5);
  jobs.mutable_jobs(0)->set_val_loss(0.98765);
  jobs.mutable_jobs(1)->set_val_step(5);
  jobs.mutable_jobs(1)->set_val_windows(993);
  jobs.mutable_jobs(1)->set_val_matches(966);
  const std::vector<std::string> validated = absl::StrSplit(JobsTable(jobs, now), '\n');
  const size_t val_column = validated[0].find("VAL");
  ASSERT_NE(val_column, std::string::npos) << validated[0];
  EXPECT_EQ(validated[1].substr(val_column, 7), "0.9877 ") << validated[1];
  EXPECT_EQ(validated[2].substr(val_column, 6), "97.3% ") << validated[2];
  EXPECT_EQ(validated[3].substr(val_column, 2), "- ") << "no pass yet: " << validated[3];

  shardline::v1::JobStatus s = Running();
  s.set_submitted_at(1'800'000'000.0);
  s.set_started_at(1'800'000'042.5);
  std::string text = DescribeJob(s);
  EXPECT_NE(text.find("Submitted:  2027-01-15 08:00:00 UTC\nStarted:    2027-01-15 08:00:42 UTC\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("Ended:"), std::string::npos) << text;
  s.set_submitted_by("ops");
  text = DescribeJob(s);
  EXPECT_NE(text.find("Submitted:  2027-01-15 08:00:00 UTC by ops\nStarted:"), std::string::npos) << text;
  EXPECT_EQ(text.find("Started at:"), std::string::npos) << "from the seed: " << text;
  s.set_init_from("job-3");
  s.set_init_step(40);
  text = DescribeJob(s);
  EXPECT_NE(text.find("\nStarted at: the weights of job-3 at its step 40\n"), std::string::npos) << text;
  s.set_init_from(common::kSentWeights);
  text = DescribeJob(s);
  EXPECT_NE(text.find("\nStarted at: the weights sent with it (step 40 of what trained them)\n"), std::string::npos)
      << text;
  s.set_init_step(-1);  // a file that names no step
  text = DescribeJob(s);
  EXPECT_NE(text.find("\nStarted at: the weights sent with it\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("Validation:"), std::string::npos) << "none yet: " << text;
  s.set_val_step(400);
  s.set_val_loss(1.23456);
  s.set_val_windows(200);
  text = DescribeJob(s);
  EXPECT_NE(text.find("\nValidation: loss 1.2346 after step 400 (200 windows)\n"), std::string::npos) << text;
  s.set_val_matches(199);
  text = DescribeJob(s);
  EXPECT_NE(text.find("\nValidation: 199 of 200 held-out problems right (99.50%), loss 1.2346, after step 400\n"),
            std::string::npos)
      << text;
  s.clear_val_matches();
  s.set_best_val_step(400);
  s.set_best_val_loss(1.23456);
  text = DescribeJob(s);
  EXPECT_EQ(text.find("Best pass:"), std::string::npos) << "the latest is the best: " << text;
  s.set_best_val_step(200);
  s.set_best_val_loss(1.0);
  s.set_passes_since_best(1);
  text = DescribeJob(s);
  EXPECT_NE(text.find("\nBest pass:  loss 1.0000 after step 200 (1 later pass did not beat it)\n"), std::string::npos)
      << text;
  s.set_best_val_accuracy(0.912);
  s.set_passes_since_best(2);
  text = DescribeJob(s);
  EXPECT_NE(text.find("\nBest pass:  accuracy 91.20%, loss 1.0000 after step 200 (2 later passes did not beat it)\n"),
            std::string::npos)
      << text;
  s.set_ended_at(1'800'003'600.0);
  text = DescribeJob(s);
  EXPECT_NE(text.find("Ended:      2027-01-15 09:00:00 UTC\n"), std::string::npos) << text;
}

// After a restart, where each position's state came from.
TEST(JobProgressTest, DescribeSaysWhereARestartedPositionsStateCameFrom) {
  shardline::v1::JobStatus s = Running();
  s.mutable_stages(0)->set_resumed_from("its own memory");
  s.mutable_stages(1)->set_resumed_from("its twin at 10.0.0.7:7500");
  const std::string text = DescribeJob(s);
  EXPECT_NE(text.find("CHECKPOINT S (WAIT)  STATE FROM\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  its own memory\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  its twin at 10.0.0.7:7500\n"), std::string::npos) << text;
}

// The hang explainer's lines: what each position said at its worker's last
// heartbeat, and, for a worker silent too long, that its word is old.
TEST(JobProgressTest, DescribeSaysWhatEachPositionDoesNow) {
  shardline::v1::JobStatus s = Running();
  s.mutable_stages(0)->set_activity("waits for GRADIENT of micro-batch 5 from stage 1");
  s.mutable_stages(0)->set_activity_step(301);
  s.mutable_stages(0)->set_activity_seconds(4.12);
  s.mutable_stages(0)->set_heartbeat_age_seconds(0.3);
  s.mutable_stages(1)->set_activity("backward of micro-batch 5");
  s.mutable_stages(1)->set_activity_step(301);
  s.mutable_stages(1)->set_activity_seconds(9);
  s.mutable_stages(1)->set_heartbeat_age_seconds(4.5);
  const std::string text = DescribeJob(s);
  EXPECT_NE(text.find("Now:\n"
                      "  stage 0 (worker gpu-a): step 301, waits for GRADIENT of micro-batch 5 from stage 1 since 4.1 s\n"
                      "  stage 1 (worker cpu-long-name): no heartbeat for 4.5 s; it last said: step 301, backward of "
                      "micro-batch 5\n"),
            std::string::npos)
      << text;
}

// A 2 × 2 grid: the progress line shows each stage's mean over its
// replicas; describe adds a REPLICA column.
TEST(JobProgressTest, ReplicasShowPerStageAndInTheirOwnColumn) {
  shardline::v1::JobStatus s = Running();
  for (int i = 0; i < 2; ++i) {
    auto* st = s.add_stages();
    st->set_stage(i);
    st->set_replica(1);
    st->set_worker(absl::StrCat("twin-", i));
    st->set_busy_fraction(i == 0 ? 0.7 : 0.125);
  }
  EXPECT_EQ(ProgressLine(s), "job-7 RUNNING [#####---------------] 300/1200  loss 0.1235  16.2k tok/s  busy 60% 50%");
  const std::string text = DescribeJob(s);
  EXPECT_NE(text.find("STAGE  REPLICA  WORKER"), std::string::npos) << text;
  EXPECT_NE(text.find("\n1      1        twin-1 "), std::string::npos) << text;
}

// A tensor-parallel grid: a TENSOR column, in describe and plan (with the
// bytes each rank's all-reduces move per step).
TEST(JobProgressTest, TensorRanksShowInTheirOwnColumn) {
  shardline::v1::JobStatus s = Running();
  s.mutable_stages(1)->set_stage(0);
  s.mutable_stages(1)->set_tensor_rank(1);
  const std::string text = DescribeJob(s);
  EXPECT_NE(text.find("STAGE  TENSOR  WORKER"), std::string::npos) << text;
  EXPECT_NE(text.find("\n0      1       cpu-long-name "), std::string::npos) << text;
  shardline::v1::PlanResponse plan;
  for (int k = 0; k < 2; ++k) {
    auto* st = plan.add_stages();
    st->set_tensor_rank(k);
    st->set_worker(absl::StrCat("w", k));
    st->set_tensor_bytes_per_step(3 << 20);
  }
  const std::string table = PlanTable(plan);
  EXPECT_NE(table.find("TENSOR ALL-REDUCES/STEP"), std::string::npos) << table;
  EXPECT_NE(table.find("3.0 MiB"), std::string::npos) << table;
}

TEST(JobProgressTest, LinksShowWhatJobsObservedAndTheWorkersWhoseOwnLinkLooksSlow) {
  shardline::v1::ListLinksResponse links;
  shardline::v1::LinkStatus* l = links.add_links();
  l->set_from_worker("a1");
  l->set_to_worker("a2");
  l->set_bytes_per_second(125e6);
  l->set_rtt_seconds(2e-4);
  l->set_age_seconds(40);
  l->set_observed_bytes_per_second(0.625e6);
  l->set_observed_age_seconds(3);
  l->set_observed_in("job-1");
  shardline::v1::SuspectedLink* s = links.add_suspected();
  s->set_worker("a1");
  s->set_bytes_per_second(0.75e6);
  s->set_age_seconds(2);
  s->set_job("job-1");
  links.set_pending_probes(8);
  const std::string table = LinksTable(links);
  EXPECT_NE(table.find("slowed to 5 Mbit/s in job job-1 3 s ago"), std::string::npos) << table;
  EXPECT_NE(table.find("worker a1: its own link looks slow (its links to two or more peers slowed in job job-1, 2 s "
                       "ago): its links are planned at no more than 6 Mbit/s until probed again"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("8 directions still to probe"), std::string::npos) << table;

  // A probe found a link slowed; a worker suspected on probes alone.
  l->clear_observed_bytes_per_second();
  l->set_slowed_from_bytes_per_second(125e6);
  l->set_bytes_per_second(0.625e6);
  s->clear_job();
  const std::string probed = LinksTable(links);
  EXPECT_NE(probed.find("probed over 3x slower than its probe before (1000 Mbit/s)"), std::string::npos) << probed;
  EXPECT_EQ(probed.find("slowed to"), std::string::npos) << probed;
  EXPECT_NE(probed.find("its links to two or more peers slowed in probes, 2 s ago"), std::string::npos) << probed;

  // In doubt: checked again, against busy workers too.
  l->set_fast_before_bytes_per_second(125e6);
  l->set_next_check_seconds(42);
  const std::string doubted = LinksTable(links);
  EXPECT_NE(doubted.find("in doubt (1000 Mbit/s before): checked again in 42 s"), std::string::npos) << doubted;
  EXPECT_EQ(doubted.find("at least this"), std::string::npos) << doubted;
  l->set_checked(true);
  const std::string checked = LinksTable(links);
  EXPECT_NE(checked.find("checked with short transfers: at least this; probed again once both ends are idle"),
            std::string::npos)
      << checked;
}

}  // namespace
}  // namespace shardline::client
