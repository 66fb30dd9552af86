// Text for people about jobs and workers: the live progress line of
// `shardctl watch` and shardline-local, and the tables of `shardctl get`.
#ifndef SHARDLINE_CLIENT_JOB_PROGRESS_H_
#define SHARDLINE_CLIENT_JOB_PROGRESS_H_

#include <string>

#include "absl/time/time.h"
#include "shardline/v1/admin.pb.h"

namespace shardline::client {

// "job-1 RUNNING [########------------] 120/1500  loss 0.1234  16.2k tok/s  busy 45% 52% 60%"
std::string ProgressLine(const shardline::v1::JobStatus& status);
// JOB NAME STATE STEP LOSS TOK/S CHECKPOINT (its files at the coordinator)
// AGE (since it was submitted, as of `now`) MESSAGE.
std::string JobsTable(const shardline::v1::ListJobsResponse& jobs, absl::Time now);
std::string WorkersTable(const shardline::v1::ListWorkersResponse& workers);
// One worker as WorkersTable shows it (drain, undrain).
std::string WorkerTable(const shardline::v1::WorkerStatus& worker);
std::string PlanTable(const shardline::v1::PlanResponse& plan);
// plan --explain: each position's predicted compute, tensor collectives,
// hop and all-reduce, memory; the slot, the step and what sets the pace.
std::string ExplainPlan(const shardline::v1::PlanResponse& plan);
// FROM TO MBIT/S (± half the spread) RTT AGE, and the probes still queued.
std::string LinksTable(const shardline::v1::ListLinksResponse& links);
std::string DescribeJob(const shardline::v1::JobStatus& status);

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_JOB_PROGRESS_H_
