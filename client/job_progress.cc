#include "client/job_progress.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "common/validation_best.h"

namespace shardline::client {
namespace {

std::string Rate(double tps) {
  if (tps >= 1e6) return absl::StrFormat("%.2fM", tps / 1e6);
  if (tps >= 1e3) return absl::StrFormat("%.1fk", tps / 1e3);
  return absl::StrFormat("%.0f", tps);
}

std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&out, c ? "  " : "", row[c],
                      c + 1 < row.size() ? std::string(widths[c] - row[c].size(), ' ') : "");
    }
    out += "\n";
  }
  return out;
}

absl::Time TimeOf(double unix_seconds) { return absl::UnixEpoch() + absl::Seconds(unix_seconds); }

// As kubectl's AGE: the largest unit, whole (45s, 12m, 3h, 5d).
std::string Age(absl::Duration d) {
  const int64_t seconds = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (seconds < 60) return absl::StrCat(seconds, "s");
  if (seconds < 3600) return absl::StrCat(seconds / 60, "m");
  if (seconds < 86400) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds / 86400, "d");
}

// Disk use in decimal units: "305.2 MB", "12.1 GB"; "-" for none.
std::string Size(int64_t bytes) {
  if (bytes <= 0) return "-";
  return bytes >= 1'000'000'000 ? absl::StrFormat("%.1f GB", bytes / 1e9) : absl::StrFormat("%.1f MB", bytes / 1e6);
}

// The latest validation pass: its loss ("0.1234"), or for exact match the
// share of problems right ("97.3%").
std::string Validation(const shardline::v1::JobStatus& s) {
  if (!s.has_val_matches()) return absl::StrFormat("%.4f", s.val_loss());
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(s.val_matches()) /
                                       static_cast<double>(std::max<int64_t>(1, s.val_windows())));
}

// "2026-12-05 17:30:02 UTC", or "-" for a time not reached.
std::string When(double unix_seconds) {
  return unix_seconds > 0 ? absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", TimeOf(unix_seconds), absl::UTCTimeZone()) : "-";
}

}  // namespace

std::string ProgressLine(const shardline::v1::JobStatus& s) {
  constexpr int kWidth = 20;
  const double done = s.total_steps() > 0 ? static_cast<double>(s.step()) / s.total_steps() : 0.0;
  const int filled = static_cast<int>(done * kWidth + 0.5);
  std::string line = absl::StrFormat("%s %s [%s%s] %d/%d", s.job_id(), JobState_Name(s.state()),
                                     std::string(filled, '#'), std::string(kWidth - filled, '-'),
                                     s.step(), s.total_steps());
  if (s.step() > 0) {
    absl::StrAppendFormat(&line, "  loss %.4f", s.loss());
    if (s.val_step() > 0) absl::StrAppend(&line, "  val ", Validation(s));
    absl::StrAppendFormat(&line, "  %s tok/s", Rate(s.tokens_per_s()));
  }
  if (s.stages_size() > 0 && s.step() > 0) {
    // Per stage; with replicas, the mean over a stage's replicas.
    std::vector<double> busy, count;
    for (const auto& stage : s.stages()) {
      const size_t i = static_cast<size_t>(stage.stage());
      if (busy.size() <= i) busy.resize(i + 1, 0.0), count.resize(i + 1, 0.0);
      busy[i] += stage.busy_fraction();
      count[i] += 1;
    }
    line += "  busy";
    for (size_t i = 0; i < busy.size(); ++i) {
      absl::StrAppendFormat(&line, " %.0f%%", count[i] > 0 ? 100 * busy[i] / count[i] : 0.0);
    }
  }
  if (!s.message().empty()) absl::StrAppend(&line, "  (", s.message(), ")");
  return line;
}

std::string JobsTable(const shardline::v1::ListJobsResponse& jobs, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "NAME", "STATE", "STEP", "LOSS", "VAL", "TOK/S", "CHECKPOINT", "AGE", "MESSAGE"}};
  for (const auto& j : jobs.jobs()) {
    rows.push_back({j.job_id(), j.name(), JobState_Name(j.state()),
                    absl::StrCat(j.step(), "/", j.total_steps()), absl::StrFormat("%.4f", j.loss()),
                    j.val_step() > 0 ? Validation(j) : "-", Rate(j.tokens_per_s()), Size(j.checkpoint_bytes()),
                    j.submitted_at() > 0 ? Age(now - TimeOf(j.submitted_at())) : "-", j.message()});
  }
  return Table(rows);
}

std::string WorkersTable(const shardline::v1::ListWorkersResponse& workers) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "ID", "STATE", "JOB", "DEVICE", "GFLOP/S", "ACHIEVED", "MEMORY", "ADDRESS"}};
  for (const auto& w : workers.workers()) {
    rows.push_back({w.name(), w.worker_id(), w.state(), w.job_id().empty() ? "-" : w.job_id(), w.device(),
                    absl::StrFormat("%.1f ±%.0f%%", w.gemm_flops() / 1e9, 50 * w.gemm_flops_spread()),
                    w.achieved_flops() > 0 ? absl::StrFormat("%.1f", w.achieved_flops() / 1e9) : "-",
                    absl::StrFormat("%.1f GiB", static_cast<double>(w.memory_bytes()) / (1 << 30)),
                    w.listen_address()});
  }
  return Table(rows);
}

std::string LinksTable(const shardline::v1::ListLinksResponse& links) {
  std::vector<std::vector<std::string>> rows = {{"FROM", "TO", "MBIT/S", "RTT", "AGE", "NOTE"}};
  for (const auto& l : links.links()) {
    std::string note = l.stale() && l.bytes_per_second() > 0 ? "stale" : "";
    if (!l.error().empty()) absl::StrAppend(&note, note.empty() ? "" : "; ", "last probe failed: ", l.error());
    if (l.observed_bytes_per_second() > 0) {
      absl::StrAppendFormat(&note, "%sslowed to %.0f Mbit/s in job %s %.0f s ago (planned on until probed again)",
                            note.empty() ? "" : "; ", l.observed_bytes_per_second() * 8 / 1e6, l.observed_in(),
                            l.observed_age_seconds());
    }
    if (l.slowed_from_bytes_per_second() > 0) {
      absl::StrAppendFormat(&note, "%sprobed over 3x slower than its probe before (%.0f Mbit/s)",
                            note.empty() ? "" : "; ", l.slowed_from_bytes_per_second() * 8 / 1e6);
    }
    if (l.checked()) {
      absl::StrAppend(&note, note.empty() ? "" : "; ",
                      "checked with short transfers: at least this; probed again once both ends are idle");
    }
    if (l.fast_before_bytes_per_second() > 0) {
      absl::StrAppendFormat(&note, "%sin doubt (%.0f Mbit/s before): checked again in %.0f s",
                            note.empty() ? "" : "; ", l.fast_before_bytes_per_second() * 8 / 1e6,
                            l.next_check_seconds());
    }
    rows.push_back({l.from_worker(), l.to_worker(),
                    l.bytes_per_second() > 0
                        ? absl::StrFormat("%.0f ±%.0f%%", l.bytes_per_second() * 8 / 1e6, 50 * l.bytes_per_second_spread())
                        : "-",
                    l.rtt_seconds() > 0 ? absl::StrFormat("%.2f ms", l.rtt_seconds() * 1e3) : "-",
                    l.bytes_per_second() > 0 || !l.error().empty() ? absl::StrFormat("%.0f s", l.age_seconds()) : "-",
                    note.empty() ? "-" : note});
  }
  std::string out = Table(rows);
  for (const auto& s : links.suspected()) {
    const std::string where = s.job().empty() ? "in probes" : absl::StrCat("in job ", s.job());
    absl::StrAppendFormat(&out,
                          "worker %s: its own link looks slow (its links to two or more peers slowed %s, %.0f s "
                          "ago): its links are planned at no more than %.0f Mbit/s until probed again\n",
                          s.worker(), where, s.age_seconds(), s.bytes_per_second() * 8 / 1e6);
  }
  if (links.pending_probes() > 0) {
    absl::StrAppendFormat(&out, "%d directions still to probe (%d now)\n", links.pending_probes(), links.probing());
  }
  return out;
}

std::string WorkerTable(const shardline::v1::WorkerStatus& worker) {
  shardline::v1::ListWorkersResponse one;
  *one.add_workers() = worker;
  return WorkersTable(one);
}

std::string PlanTable(const shardline::v1::PlanResponse& plan) {
  bool replicas = false, tensor = false;
  for (const auto& s : plan.stages()) {
    replicas |= s.replica() > 0;
    tensor |= s.tensor_rank() > 0;
  }
  std::vector<std::vector<std::string>> rows = {{"STAGE", "WORKER", "UNITS", "MS/MICRO-BATCH", "MEMORY"}};
  if (tensor) rows[0].insert(rows[0].begin() + 1, "TENSOR");
  if (replicas) {
    rows[0].insert(rows[0].begin() + 1, "REPLICA");
    rows[0].push_back("ALL-REDUCE/STEP");
  }
  if (tensor) rows[0].push_back("TENSOR ALL-REDUCES/STEP");
  for (const auto& s : plan.stages()) {
    std::vector<std::string> row = {
        absl::StrCat(s.stage()), s.worker(), absl::StrCat("[", s.unit_begin(), ", ", s.unit_end(), ")"),
        absl::StrFormat("%.3f", s.seconds_per_micro_batch() * 1e3),
        absl::StrFormat("%.1f MiB", static_cast<double>(s.memory_bytes()) / (1 << 20))};
    if (tensor) row.insert(row.begin() + 1, absl::StrCat(s.tensor_rank()));
    if (replicas) {
      row.insert(row.begin() + 1, absl::StrCat(s.replica()));
      row.push_back(absl::StrFormat("%.1f MiB", static_cast<double>(s.reduce_bytes_per_step()) / (1 << 20)));
    }
    if (tensor) row.push_back(absl::StrFormat("%.1f MiB", static_cast<double>(s.tensor_bytes_per_step()) / (1 << 20)));
    rows.push_back(std::move(row));
  }
  return Table(rows) + absl::StrFormat("predicted step: %.4f s (pipeline bubble %.0f%%)\n",
                                       plan.predicted_step_seconds(), 100 * plan.bubble_fraction());
}

std::string ExplainPlan(const shardline::v1::PlanResponse& plan) {
  std::vector<std::vector<std::string>> rows = {{"STAGE", "REPLICA", "TENSOR", "WORKER", "UNITS", "COMPUTE MS",
                                                 "TENSOR MS", "HOP MS", "WIRE", "ALL-REDUCE MS/STEP", "REDUCE WIRE",
                                                 "MEMORY"}};
  auto ms = [](double seconds) { return seconds > 0 ? absl::StrFormat("%.3f", seconds * 1e3) : std::string("-"); };
  for (const auto& s : plan.stages()) {
    rows.push_back({absl::StrCat(s.stage()), absl::StrCat(s.replica()), absl::StrCat(s.tensor_rank()), s.worker(),
                    absl::StrCat("[", s.unit_begin(), ", ", s.unit_end(), ")"), ms(s.compute_seconds()),
                    ms(s.tensor_seconds()), ms(s.hop_seconds()), s.wire_to_next().empty() ? "-" : s.wire_to_next(),
                    ms(s.reduce_seconds()), s.wire_reduce().empty() ? "-" : s.wire_reduce(),
                    absl::StrFormat("%.1f MiB", static_cast<double>(s.memory_bytes()) / (1 << 20))});
  }
  return Table(rows) +
         absl::StrFormat(
             "COMPUTE and TENSOR (its tensor group's collectives) are per micro-batch, forward and backward; HOP is\n"
             "a micro-batch's activation (or gradient) to the next stage over the measured link, in WIRE's format;\n"
             "ALL-REDUCE is the data-parallel sum of the stage's gradients once a step, in REDUCE WIRE's format.\n"
             "slot: %.3f ms (the slowest stage or hop per micro-batch); pipeline bubble %.0f%%; fill and drain "
             "%.3f ms (one micro-batch through every stage and hop and back); optimizer %s\n"
             "predicted step: %.4f s = (micro-batches - 1) x slot + fill and drain + optimizer + the slowest "
             "all-reduce\n"
             "critical path: %s\n",
             plan.slot_seconds() * 1e3, 100 * plan.bubble_fraction(), plan.fill_seconds() * 1e3,
             plan.optimizer_seconds() > 0 ? absl::StrFormat("%.3f ms", plan.optimizer_seconds() * 1e3)
                                          : std::string("not known yet (from the first job's reports)"),
             plan.predicted_step_seconds(),
             plan.critical_path().empty() ? "-" : plan.critical_path());
}

std::string DescribeJob(const shardline::v1::JobStatus& s) {
  std::string out = absl::StrFormat(
      "Job:        %s (%s)\nState:      %s\nStep:       %d/%d\nLoss:       %.6f\nLR:         %.3g\n"
      "Grad norm:  %.4f\nTokens/s:   %.1f\nPlan epoch: %d\nCommitted:  %s\n",
      s.job_id(), s.name(), JobState_Name(s.state()), s.step(), s.total_steps(), s.loss(), s.lr(),
      s.grad_norm(), s.tokens_per_s(), s.plan_epoch(),
      s.committed_step() >= 0
          ? absl::StrCat("step ", s.committed_step(),
                         s.checkpoint_bytes() > 0 ? absl::StrCat(" (", Size(s.checkpoint_bytes()), ")") : "")
          : "none");
  if (s.val_step() > 0 && s.has_val_matches()) {
    absl::StrAppend(&out, absl::StrFormat("Validation: %d of %d held-out problems right (%.2f%%), loss %.4f, after "
                                          "step %d\n",
                                          s.val_matches(), s.val_windows(),
                                          100.0 * s.val_matches() / std::max<int64_t>(1, s.val_windows()),
                                          s.val_loss(), s.val_step()));
  } else if (s.val_step() > 0) {
    absl::StrAppend(&out, absl::StrFormat("Validation: loss %.4f after step %d (%d windows)\n", s.val_loss(),
                                          s.val_step(), s.val_windows()));
  }
  if (s.best_val_step() > 0 && s.best_val_step() != s.val_step()) {
    absl::StrAppend(&out, absl::StrFormat("Best pass:  %s after step %d (%d later pass%s did not beat it)\n",
                                          common::PassMeasures(common::BestOf(s).pass), s.best_val_step(),
                                          s.passes_since_best(), s.passes_since_best() == 1 ? "" : "es"));
  }
  if (s.init_from() == common::kSentWeights) {
    absl::StrAppend(&out, "Started at: the weights sent with it",
                    s.init_step() >= 0 ? absl::StrCat(" (step ", s.init_step(), " of what trained them)") : "", "\n");
  } else if (!s.init_from().empty()) {
    absl::StrAppend(&out, "Started at: the weights of ", s.init_from(), " at its step ", s.init_step(), "\n");
  }
  if (s.predicted_step_seconds() > 0) {
    // The plan's prediction against the last step as it went.
    absl::StrAppendFormat(&out, "Step time:  %s, predicted %.3f s%s\n",
                          s.step_seconds() > 0 ? absl::StrFormat("%.3f s", s.step_seconds()) : "not yet measured",
                          s.predicted_step_seconds(),
                          s.step_seconds() > 0
                              ? absl::StrFormat(" (measured %+.0f%%)",
                                                100 * (s.step_seconds() / s.predicted_step_seconds() - 1))
                              : "");
    if (!s.critical_path().empty()) absl::StrAppend(&out, "Paced by:   ", s.critical_path(), "\n");
  }
  if (!s.message().empty()) absl::StrAppend(&out, "Message:    ", s.message(), "\n");
  if (!s.weighed().empty()) absl::StrAppend(&out, "Weighed:    ", s.weighed(), "\n");
  absl::StrAppend(&out, "Submitted:  ", When(s.submitted_at()),
                  s.submitted_by().empty() ? "" : absl::StrCat(" by ", s.submitted_by()), "\nStarted:    ",
                  When(s.started_at()), "\n");
  if (s.ended_at() > 0) absl::StrAppend(&out, "Ended:      ", When(s.ended_at()), "\n");
  if (s.stages_size() > 0) {
    bool replicas = false, tensor = false;
    for (const auto& st : s.stages()) {
      replicas |= st.replica() > 0;
      tensor |= st.tensor_rank() > 0;
    }
    auto position = [&](const shardline::v1::StageStatus& st) {
      std::string label = absl::StrCat("stage ", st.stage());
      if (replicas) absl::StrAppend(&label, " replica ", st.replica());
      if (tensor) absl::StrAppend(&label, " tensor ", st.tensor_rank());
      return label;
    };
    std::vector<std::vector<std::string>> rows = {{"STAGE", "WORKER", "UNITS", "BUSY", "STEP S", "PEAK MICRO-BATCHES",
                                                   "LINK PEAK MIB", "MINOR FAULTS/GIB RECEIVED", "CHECKPOINT S (WAIT)"}};
    if (tensor) rows[0].insert(rows[0].begin() + 1, "TENSOR");
    if (replicas) rows[0].insert(rows[0].begin() + 1, "REPLICA");
    bool resumed = false;  // a restart after step 1: where each position's state came from
    for (const auto& st : s.stages()) resumed |= !st.resumed_from().empty();
    if (resumed) rows[0].push_back("STATE FROM");
    for (const auto& st : s.stages()) {
      std::vector<std::string> row = {
          absl::StrCat(st.stage()), st.worker(), absl::StrCat("[", st.unit_begin(), ", ", st.unit_end(), ")"),
          absl::StrFormat("%.0f%%", 100 * st.busy_fraction()), absl::StrFormat("%.3f", st.step_seconds()),
          absl::StrCat(st.peak_slots()),
          absl::StrFormat("%.1f", static_cast<double>(st.link_peak_bytes()) / (1 << 20)),
          absl::StrFormat("%.0f", st.minor_faults_per_gib()),
          st.checkpoint_seconds() > 0
              ? absl::StrFormat("%.3f (%.3f)", st.checkpoint_seconds(), st.checkpoint_wait_seconds())
              : "-"};
      if (tensor) row.insert(row.begin() + 1, absl::StrCat(st.tensor_rank()));
      if (replicas) row.insert(row.begin() + 1, absl::StrCat(st.replica()));
      if (resumed) row.push_back(st.resumed_from().empty() ? "-" : st.resumed_from());
      rows.push_back(std::move(row));
    }
    out += "Stages:\n" + Table(rows);
    // The hang explainer: what each position said it was doing at its
    // worker's last heartbeat (a running job only).
    std::string now;
    for (const auto& st : s.stages()) {
      if (st.activity().empty() && st.heartbeat_age_seconds() == 0) continue;
      const std::string said = st.activity().empty()
                                   ? "nothing reported"
                                   : absl::StrFormat("step %d, %s", st.activity_step(), st.activity());
      absl::StrAppend(&now, "  ", position(st), " (worker ", st.worker(), "): ");
      // Heartbeats come every lease/4, at least one a second: older ones
      // mean the worker is stalled or cut off, and what it said is old news.
      if (st.heartbeat_age_seconds() > 3) {
        absl::StrAppend(&now, absl::StrFormat("no heartbeat for %.1f s; it last said: %s", st.heartbeat_age_seconds(),
                                              said));
      } else {
        absl::StrAppend(&now, said,
                        st.activity().empty() ? "" : absl::StrFormat(" since %.1f s", st.activity_seconds()));
      }
      now += "\n";
    }
    if (!now.empty()) out += "Now:\n" + now;
  }
  return out;
}

}  // namespace shardline::client
