// JobManager's reading of the wires a job's streams cross: a link that
// slowed goes into the link table (job_manager.h).
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "server/grid_cost.h"
#include "server/job_manager.h"

namespace shardline::server {

void JobManager::NoteWirePaces(RunningJob& job, int position, const shardline::v1::ReportStepRequest& r) {
  const RunningJob::Position at = job.PositionAt(position);
  for (const shardline::v1::WirePace& w : r.wire_paces()) {
    int stage = at.stage, replica = at.replica;
    if (w.peer() == shardline::v1::WirePace::PREVIOUS_STAGE) --stage;
    if (w.peer() == shardline::v1::WirePace::NEXT_STAGE) ++stage;
    if (w.peer() == shardline::v1::WirePace::REPLICA) replica = w.replica();
    if (stage < 0 || stage >= job.stages() || replica < 0 || replica >= job.replicas()) continue;
    const int peer = job.PositionOf(stage, replica, at.tensor_rank);
    if (peer == position) continue;
    const std::string& from_id = job.workers()[static_cast<size_t>(peer)];
    const std::string& to_id = job.workers()[static_cast<size_t>(position)];
    LinkPace& pace = job.link_paces().At(from_id, to_id);
    pace.Note(w.bytes(), w.seconds());
    VLOG(1) << "job " << job.status().job_id() << " step " << r.step() << ": " << job.PositionName(position)
            << "'s frames from " << job.PositionName(peer) << ": " << w.bytes() << " bytes in " << w.seconds()
            << " s; recent " << pace.recent() * 8 / 1e6 << " Mbit/s, baseline " << pace.baseline() * 8 / 1e6;
    if (pace.recent() == 0) continue;
    absl::StatusOr<WorkerRecord> from = registry_.Get(from_id), to = registry_.Get(to_id);
    if (!from.ok() || !to.ok() || from->name == to->name) continue;
    // Slower than its probe said (the epoch may have begun on a link that
    // had slowed already), or, never probed, than earlier in the epoch. A
    // pace above the probe's is not the wire's: frames that waited in a
    // busy receiver's socket buffer read as if they arrived together (on
    // the testbed, 1.9 Gbit/s on a 1 Gbit/s link into a worker at 0.2 CPU,
    // then a third of that while the wire carried its 1 Gbit/s).
    const std::optional<LinkRecord> probed = links_.Get(from->name, to->name);
    const double probe = probed.has_value() ? probed->bytes_per_second : 0;
    const double reference = probe > 0 ? probe : pace.baseline();
    const bool slowed = pace.Below(reference);
    if (!slowed && !pace.told) continue;
    if (slowed) {
      if (!pace.told) {
        LOG(WARNING) << "job " << job.status().job_id() << ": the link from " << from->name << " to " << to->name
                     << " slowed to " << pace.recent() * 8 / 1e6 << " Mbit/s (from " << reference * 8 / 1e6
                     << " Mbit/s " << (probe > 0 ? "when probed" : "earlier in the epoch") << "; "
                     << job.PositionName(position) << "'s frames from " << job.PositionName(peer) << ")";
        job.set_link_slowed(true);
      }
      for (const std::string& name : links_.Observe(from->name, to->name, pace.recent(), job.status().job_id(), reference)) {
        const std::optional<LinkSuspicion> suspect = links_.Suspected(name);
        if (!suspect.has_value()) continue;  // probed meanwhile
        LOG(WARNING) << "job " << job.status().job_id() << ": worker " << name
                     << "'s own link looks slow (its links to two or more peers slowed): all its links are planned "
                        "at no more than "
                     << suspect->bytes_per_second * 8 / 1e6 << " Mbit/s until probed again";
      }
      pace.told = true;
    } else {
      LOG(INFO) << "job " << job.status().job_id() << ": the link from " << from->name << " to " << to->name
                << " carries " << pace.recent() * 8 / 1e6 << " Mbit/s again";
      links_.ForgetObserved(from->name, to->name);
      pace.told = false;
    }
  }
}

std::vector<RunningJob::DoubtedLink> JobManager::ProbeDoubtedEnds(const RunningJob& job) {
  std::vector<WorkerRecord> ends;  // the job's workers
  for (const std::string& id : job.workers()) {
    absl::StatusOr<WorkerRecord> w = registry_.Get(id);
    if (w.ok()) ends.push_back(*std::move(w));
  }
  const std::vector<WorkerRecord> idle = registry_.Idle();  // the job's among them once released
  // The third worker for `end`'s side of a doubted link: idle, on another
  // host (within one the link is memory), its link with `end` probed
  // before, not slowed since: the fastest such (a slowdown shows most).
  auto third = [&](const WorkerRecord& end, const WorkerRecord& other, bool from_end) -> std::optional<std::string> {
    std::optional<std::string> best;
    double fastest = 0;
    for (const WorkerRecord& y : idle) {
      if (y.name == end.name || y.name == other.name || HostOf(y) == HostOf(end)) continue;
      const std::optional<LinkRecord> l = from_end ? links_.Get(end.name, y.name) : links_.Get(y.name, end.name);
      if (!l.has_value() || l->bytes_per_second <= fastest || l->observed_bytes_per_second > 0) continue;
      fastest = l->bytes_per_second;
      best = y.name;
    }
    return best;
  };
  std::vector<RunningJob::DoubtedLink> doubted;
  std::set<RunningJob::Probe> queued;
  for (const WorkerRecord& from : ends) {
    for (const WorkerRecord& to : ends) {
      if (from.name == to.name) continue;
      const std::optional<LinkRecord> seen = links_.Get(from.name, to.name);
      if (!seen.has_value() || seen->observed_bytes_per_second <= 0 || seen->observed_in != job.status().job_id() ||
          links_.Suspected(from.name).has_value() || links_.Suspected(to.name).has_value()) {
        continue;
      }
      RunningJob::DoubtedLink link{{from.name, to.name}, {}};
      if (std::optional<std::string> y = third(from, to, true)) link.probes.push_back({from.name, *y});
      if (std::optional<std::string> y = third(to, from, false)) link.probes.push_back({*y, to.name});
      if (link.probes.empty()) continue;
      for (const RunningJob::Probe& p : link.probes) {
        if (queued.insert(p).second) links_.Queue(p.first, p.second);
      }
      doubted.push_back(std::move(link));
    }
  }
  if (!queued.empty()) {
    LOG(INFO) << "job " << job.status().job_id() << ": before re-planning, probing "
              << absl::StrJoin(queued, ", ", [](std::string* out, const RunningJob::Probe& p) {
                   absl::StrAppend(out, p.first, " -> ", p.second);
                 })
              << " (which end of a link it saw slow is slow)";
  }
  return doubted;
}

bool JobManager::AwaitingProbes(RunningJob& job) {
  if (job.doubted_links().empty()) return false;
  std::set<std::string> pending;
  for (const RunningJob::DoubtedLink& d : job.doubted_links()) {
    if (links_.Suspected(d.link.first).has_value() || links_.Suspected(d.link.second).has_value()) continue;
    for (const auto& [from, to] : d.probes) {
      const std::vector<std::string> queued = links_.QueuedFrom(from);
      if (std::find(queued.begin(), queued.end(), to) != queued.end()) pending.insert(absl::StrCat(from, " -> ", to));
    }
  }
  if (!pending.empty() && registry_.Now() < job.probes_until()) {
    job.Wait(absl::StrCat("re-planning after step ", job.replan_step(), ": probing ", absl::StrJoin(pending, ", "),
                          " first (which end of a link it saw slow is slow)"));
    return true;
  }
  if (!pending.empty()) {
    LOG(WARNING) << "job " << job.status().job_id() << ": " << absl::StrJoin(pending, ", ") << " not probed within "
                 << absl::FormatDuration(kReplanProbeWait) << ": re-planning on what is known";
  }
  std::set<std::string> probed;
  for (const RunningJob::DoubtedLink& d : job.doubted_links()) probed.insert({d.link.first, d.link.second});
  for (const std::string& name : probed) {
    if (std::optional<LinkSuspicion> s = links_.Suspected(name)) {
      LOG(WARNING) << "job " << job.status().job_id() << ": worker " << name
                   << "'s own link looks slow (a probe found it slow too): all its links are planned at no more than "
                   << s->bytes_per_second * 8 / 1e6 << " Mbit/s until probed again";
    }
  }
  job.ClearDoubtedLinks();
  return false;
}

}  // namespace shardline::server
