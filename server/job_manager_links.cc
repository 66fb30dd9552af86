// JobManager's reading of the wires a job's streams cross: a link that
// slowed goes into the link table (job_manager.h).
#include "glog/logging.h"
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
    // Slower than earlier in the epoch, or than its probe said (the epoch
    // began on a link that had slowed already).
    const std::optional<LinkRecord> probed = links_.Get(from->name, to->name);
    const double probe = probed.has_value() ? probed->bytes_per_second : 0;
    const bool slowed = pace.slowed() || pace.Below(probe);
    if (!slowed && !pace.told) continue;
    if (slowed) {
      if (!pace.told) {
        LOG(WARNING) << "job " << job.status().job_id() << ": the link from " << from->name << " to " << to->name
                     << " slowed to " << pace.recent() * 8 / 1e6 << " Mbit/s (from "
                     << (pace.slowed() ? pace.baseline() : probe) * 8 / 1e6 << " Mbit/s "
                     << (pace.slowed() ? "earlier in the epoch" : "when probed") << "; "
                     << job.PositionName(position) << "'s frames from " << job.PositionName(peer) << ")";
        job.set_link_slowed(true);
      }
      for (const std::string& name : links_.Observe(from->name, to->name, pace.recent(), job.status().job_id())) {
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

}  // namespace shardline::server
