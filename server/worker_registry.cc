#include "server/worker_registry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/input_limits.h"
#include "common/random_token.h"

namespace shardline::server {

std::string StateOf(const WorkerRecord& w) {
  if (w.lost) return "lost";
  // Drained while its job runs on to the step it moves at.
  if (!w.job_id.empty()) return w.drained ? "draining" : "busy";
  return w.drained ? "drained" : "idle";
}

absl::StatusOr<std::string> WorkerRegistry::Register(
    const std::string& name, const shardline::v1::WorkerCapabilities& caps) {
  if (name.empty() || name.size() > 128 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
          std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker name ", common::Quote(name), " must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (caps.listen_address().empty()) {
    return absl::InvalidArgumentError("a worker must say where its StageLink service listens");
  }
  if (!(caps.gemm_flops() > 0) || !std::isfinite(caps.gemm_flops()) || caps.memory_bytes() <= 0) {
    return absl::InvalidArgumentError("a worker must report a positive GEMM rate and memory");
  }
  if (!(caps.gemm_flops_spread() >= 0 && caps.gemm_flops_spread() <= 10)) {
    return absl::InvalidArgumentError("a worker's GEMM rate spread must be 0 to 10 (a relative range)");
  }
  absl::MutexLock lock(&mu_);
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (it->second.name != name) continue;
    if (!it->second.lost) {
      return absl::AlreadyExistsError(absl::StrCat("a live worker is already named '", name, "'"));
    }
    workers_.erase(it);
    ++forgotten_;
    break;
  }
  if (workers_.size() >= kMaxWorkers) {
    // Room for one more: the longest-lost record goes, if there is one.
    auto oldest = workers_.end();
    for (auto it = workers_.begin(); it != workers_.end(); ++it) {
      if (it->second.lost && (oldest == workers_.end() || it->second.lost_at < oldest->second.lost_at)) oldest = it;
    }
    if (oldest == workers_.end()) {
      return absl::ResourceExhaustedError(absl::StrCat("the coordinator already has ", workers_.size(),
                                                       " live workers, the most it takes"));
    }
    workers_.erase(oldest);
    ++forgotten_;
  }
  WorkerRecord record;
  record.order = next_id_;
  record.id = absl::StrCat("worker-", next_id_++, tag_.empty() ? "" : ".", tag_);
  record.name = name;
  record.secret = common::RandomToken();
  record.capabilities = caps;
  record.lease_expiry = clock_() + lease_;
  record.last_heartbeat = clock_();
  record.idle_since = clock_();
  workers_[record.id] = record;
  availability_.reset();
  return record.id;
}

absl::Status WorkerRegistry::Authenticate(const std::string& worker_id, absl::string_view secret) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", common::Quote(worker_id), " is not registered; register again"));
  }
  if (!common::TokensEqual(it->second.secret, secret)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the call names worker ", common::Quote(worker_id), " without its registration's secret"));
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Heartbeat(const std::string& worker_id, const shardline::v1::StageActivity& activity) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.lost) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is not registered; register again"));
  }
  it->second.lease_expiry = clock_() + lease_;
  it->second.last_heartbeat = clock_();
  // For people to read: kept only when it looks like ours.
  const bool sane = activity.job_id().size() <= 64 && activity.doing().size() <= 256 &&
                    activity.seconds() >= 0 && activity.seconds() < 1e9;
  it->second.activity = sane ? activity : shardline::v1::StageActivity();
  return absl::OkStatus();
}

absl::StatusOr<WorkerRecord> WorkerRegistry::Leave(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.lost) return absl::NotFoundError(absl::StrCat("no live worker ", worker_id));
  it->second.lost = true;
  it->second.lost_at = clock_();
  availability_.reset();
  return it->second;
}

std::vector<WorkerRecord> WorkerRegistry::ExpireLeases() {
  std::vector<WorkerRecord> lost;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  // Lost workers are kept a while for people to see (ListWorkers), then go.
  const size_t kept = workers_.size();
  for (auto it = workers_.begin(); it != workers_.end();) {
    it = it->second.lost && now - it->second.lost_at > kLostRetention ? workers_.erase(it) : std::next(it);
  }
  forgotten_ += kept - workers_.size();
  for (auto& [id, w] : workers_) {
    if (!w.lost && w.lease_expiry < now) {
      w.lost = true;
      w.lost_at = now;
      lost.push_back(w);
    }
  }
  if (workers_.size() != kept || !lost.empty()) availability_.reset();
  return lost;
}

std::vector<WorkerRecord> WorkerRegistry::ExpireSilent(const std::vector<std::string>& ids, absl::Duration silence) {
  std::vector<WorkerRecord> lost;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  for (const std::string& id : ids) {
    auto it = workers_.find(id);
    if (it == workers_.end() || it->second.lost || now - it->second.last_heartbeat <= silence) continue;
    it->second.lost = true;
    it->second.lost_at = now;
    lost.push_back(it->second);
  }
  if (!lost.empty()) availability_.reset();
  return lost;
}

absl::StatusOr<WorkerRecord> WorkerRegistry::Get(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("no worker ", worker_id));
  return it->second;
}

absl::StatusOr<WorkerRecord> WorkerRegistry::GetByName(const std::string& name) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : workers_) {
    if (w.name == name) return w;
  }
  return absl::NotFoundError(absl::StrCat("no worker named ", common::Quote(name)));
}

absl::StatusOr<WorkerRecord> WorkerRegistry::SetDrained(const std::string& worker, bool drained) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : workers_) {
    if (w.lost || (id != worker && w.name != worker)) continue;
    w.drained = drained;
    availability_.reset();
    return w;
  }
  return absl::NotFoundError(absl::StrCat("no live worker '", worker.substr(0, 128), "'"));
}

void WorkerRegistry::SetJob(const std::string& worker_id, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  if (job_id.empty() && !it->second.job_id.empty()) it->second.idle_since = clock_();
  it->second.job_id = job_id;
  availability_.reset();
}

uint64_t WorkerRegistry::forgotten() {
  absl::MutexLock lock(&mu_);
  return forgotten_;
}

std::shared_ptr<const WorkerAvailability> WorkerRegistry::Availability() {
  absl::MutexLock lock(&mu_);
  if (availability_ != nullptr) return availability_;
  auto out = std::make_shared<WorkerAvailability>();
  for (const auto& [id, w] : workers_) {
    if (w.lost || w.drained) out->absent.insert(w.name);
    if (w.lost) continue;
    out->address[w.name] = w.capabilities.listen_address();
    if (!w.job_id.empty()) out->busy.insert(w.name);
    if (w.drained || !w.job_id.empty()) out->unavailable.insert(w.name);
  }
  availability_ = std::move(out);
  return availability_;
}

}  // namespace shardline::server
