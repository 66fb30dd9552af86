// The fixture of the re-planning tests (job_manager_replan_test.cc,
// job_manager_link_slowdown_test.cc): a JobManager whose jobs report steps
// a test makes slow.
#ifndef SHARDLINE_TESTS_SERVER_REPLAN_FIXTURE_H_
#define SHARDLINE_TESTS_SERVER_REPLAN_FIXTURE_H_

#include "tests/server/job_manager_fixture.h"

namespace shardline::server {

class ReplanTest : public testing::JobManagerTest {
 protected:
  // Reports `step` for both stages; from step `slow_from` on, the worker of
  // stage `slow_stage` computes `factor` times slower than the plan says
  // (a stage < 0: both) and every step takes that much longer.
  void ReportStep(const shardline::v1::JobStatus& job, const shardline::v1::PlanResponse& plan, int64_t step, int slow_stage,
                  int64_t slow_from, double factor) {
    const bool slow = step >= slow_from;
    for (int s = 0; s < 2; ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, step);
      const bool this_slow = slow && (slow_stage < 0 || slow_stage == s);
      r.set_busy_seconds((this_slow ? factor : 1.0) * plan.stages(s).compute_seconds());
      r.set_step_seconds(slow ? 0.5 * factor : 0.5);
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << step;
    }
  }
  // The stop step of the update delivered since `from`, 0 for none.
  int64_t StopDelivered(size_t from) {
    int64_t stop = 0;
    for (size_t i = from; i < delivered_.size(); ++i) {
      if (delivered_[i].second.stop_after_step() > 0) stop = delivered_[i].second.stop_after_step();
    }
    return stop;
  }
  // Every direction between `names` probed at `bytes_per_second`.
  void ProbeAll(const std::vector<std::string>& names, double bytes_per_second) {
    for (const std::string& from : names) {
      std::vector<LinkRecord> probes;
      for (const std::string& to : names) {
        if (from == to) continue;
        LinkRecord l;
        l.to = to;
        l.bytes_per_second = bytes_per_second;
        probes.push_back(l);
      }
      jobs_->links().Record(from, probes);
    }
  }
  int Units(const shardline::v1::JobStatus& job, int stage) {
    return job.stages(stage).unit_end() - job.stages(stage).unit_begin();
  }
};

}  // namespace shardline::server

#endif  // SHARDLINE_TESTS_SERVER_REPLAN_FIXTURE_H_
