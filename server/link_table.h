// LinkTable keeps what workers measured of the links between them (each
// direction of each pair of worker names: bandwidth with its spread, round
// trip) and the probes still to run, and decides which may run at once so
// that no two share a wire and skew each other (link_table_claims.cc):
// Claim hands a worker one queued direction at a time, and only where
//  - neither end's host is in another probe (a host's workers share its
//    network interface, or its CPU where the link is memory);
//  - the link lies inside one link group as measured so far (LinkGroups
//    over the hosts, as fast as their workers' fastest link: a rack, a
//    switch fabric), or no other probe that may leave its group runs:
//    transfers between groups may share an uplink, and until the groups
//    are known every link may leave one;
//  - fewer than the concurrency cap (SetConcurrentProbes) run.
// So a flat fabric is measured concurrently once a first chain of probes
// has shown it one group, and the links between racks one at a time. A
// measurement whose link turns out to leave its group after all, taken
// beside a probe that turns out to leave its group too, is probed again
// alone. A claim not reported within kClaimTimeout lapses. A measurement
// older than kStaleAfter is stale: shown, marked, and re-probed when asked.
// A link a running job finds slower than before (Observe) keeps that rate
// beside its probe's until it is probed again. A worker with slowed links
// to two or more peers is suspected: its own link (its NIC's share, its
// access port) is the likely cause, which slows its links the jobs did not
// use too, and a re-plan would move it onto those; every link of it is
// planned at no more than the fastest of its slowed ones until each is
// probed again. A probe that finds a link much slower than its previous
// one is such a slowed link too: a job that re-plans on one slowed link
// has each end's link to a third worker probed first (JobManager), and
// the end to blame shows there. (From the job's own streams alone, which
// end of a single slowed link is to blame nothing tells: a receiver's
// other links read fast while its token bucket lets small transfers
// through.) A link between two hosts measured or observed over
// kProbedSlowdown times below its figure before stays in doubt (LinkRecord::fast_before) until a
// measurement finds it back within that of it: where an end is busy with a
// job, its queued probe never runs (probes take idle workers), so it is
// checked instead (ClaimCheck: a short transfer, kCheckBytes, against the
// busy end too, every kCheckEvery, doubling while it stays slow). A link
// found back ends its ends' suspicion and counts in recoveries(): a job
// that moved off it weighs moving back (JobManager). A check's figure is a
// lower bound (LinkRecord::checked): the link is probed again, as any
// queued direction, once both its ends are idle.
// Pure bookkeeping, no I/O; the clock is injectable for tests. Thread-safe.
#ifndef SHARDLINE_SERVER_LINK_TABLE_H_
#define SHARDLINE_SERVER_LINK_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::server {

// A worker whose own link looks slow (LinkTable::Observe).
struct LinkSuspicion {
  double bytes_per_second = 0;  // its links are planned at no more than this
  absl::Time since;             // links probed after this are as probed
  std::string job_id;           // the job whose figures blamed it
};

struct LinkRecord {
  std::string from;
  std::string to;
  double bytes_per_second = 0;
  double spread = 0;  // (fastest − slowest) / median of its transfers
  double rtt_seconds = 0;
  absl::Time measured_at;
  std::string error;  // the last probe failed (the figures are the last good ones, if any)
  // What a job's own transfers showed once the link slowed while it ran
  // (server/link_pace.h): estimates take it where it is below the probe's
  // figure, until the next probe (queued by Observe) replaces the record.
  double observed_bytes_per_second = 0;  // 0: nothing observed
  absl::Time observed_at;
  std::string observed_in;  // the job's id
  // This probe found the link over kProbedSlowdown times slower than the
  // one before it (that one's figure; 0: not so, or an end was suspected,
  // which explains it): evidence against its ends as an observation is (a
  // suspicion, below), until one of them is suspected.
  double slowed_from = 0;
  // In doubt (see above): the figure it had before it slowed (the probe
  // before, or the pace a job's streams showed), kept while its
  // measurements stay over kProbedSlowdown times below it (0: not in
  // doubt); `checks`: how many found it slow since (the next check waits
  // kCheckEvery doubled as often, up to kCheckEveryMost).
  double fast_before = 0;
  int checks = 0;
  absl::Time next_check;  // while in doubt
  // Measured by a check (LinkTable::ClaimCheck: transfers of at most
  // kCheckBytes, maybe beside a job sharing an end's wire): the link
  // carries at least this. Its direction stays queued, and a plain probe
  // replaces the figure once both ends are idle.
  bool checked = false;
};

// A link found back (LinkTable::NoteDoubtLocked): which, and for people
// what it carries now ("a1 -> a2 carries 940 Mbit/s again (5 Mbit/s while
// slow, 940 before)").
struct LinkRecovery {
  uint64_t number = 0;  // recoveries() once it was counted
  std::string from;
  std::string to;
  std::string what;
};

class LinkTable {
 public:
  static constexpr absl::Duration kStaleAfter = absl::Minutes(10);
  static constexpr absl::Duration kClaimTimeout = absl::Seconds(60);
  static constexpr int kDefaultConcurrentProbes = 16;
  static constexpr int kMaxConcurrentProbes = 1024;
  // A probe this much slower than the link's previous one found it slowed
  // (as LinkPace's kSlowdown for a job's own transfers).
  static constexpr double kProbedSlowdown = 3.0;
  // A link in doubt with an end busy is checked this often at first, at
  // most kCheckEveryMost while it stays slow, with transfers of at most
  // kCheckBytes (a busy end's job shares its wire for about 17 MiB: 0.15 s
  // at 1 Gbit/s; 7 s at 5 Mbit/s for a link still cut, 4 MiB).
  static constexpr absl::Duration kCheckEvery = absl::Seconds(30);
  static constexpr absl::Duration kCheckEveryMost = absl::Minutes(8);
  static constexpr int64_t kCheckBytes = int64_t{4} << 20;
  static constexpr size_t kRecoveriesKept = 256;

  using Clock = std::function<absl::Time()>;
  explicit LinkTable(Clock clock = [] { return absl::Now(); }) : clock_(std::move(clock)) {}

  // At most `n` probes at once (1: one at a time; clamped to
  // [1, kMaxConcurrentProbes]).
  void SetConcurrentProbes(int n);
  // Queues both directions between `name` and each of `peers` (a worker
  // joined: its links to everyone are unknown); `host` is the host part of
  // its address (a worker never joined is a host of its own). Claims it
  // held (it registered again) end.
  void Joined(const std::string& name, const std::string& host, const std::vector<std::string>& peers);
  // Queues every direction between every two of `names`; how many were
  // not queued already.
  int Request(const std::vector<std::string>& names);
  // The peer `name` should probe now, claimed: none while `name` probes
  // already or none of its queued directions may start (see above). Peers
  // in `unavailable` (busy with a job, lost) are not probed now.
  std::optional<std::string> Claim(const std::string& name, const std::set<std::string>& unavailable = {});
  // A check `name` should run now, claimed (the peer): a direction from
  // it in doubt and due (kCheckEvery), or queued, between two hosts and
  // never measured with an end `busy` (with a job: a plain probe waits for both ends idle; a
  // worker that joined while jobs run has its links to their workers
  // measured so), never between two busy ends (their jobs would share the
  // transfer), neither in `absent` (lost, drained), on hosts in no other
  // probe, within the cap; it may leave its group where no other probe
  // that may does. `name` may be busy itself.
  std::optional<std::string> ClaimCheck(const std::string& name, const std::set<std::string>& busy,
                                        const std::set<std::string>& absent = {});
  // Found back (see above) since the table began: a job compares it with
  // what it saw when it last looked.
  uint64_t recoveries() const;
  // The links found back after the `after`th, oldest first; the last
  // kRecoveriesKept are kept (`*forgotten`, where given: how many after
  // `after` were not).
  std::vector<LinkRecovery> RecoveredSince(uint64_t after, uint64_t* forgotten = nullptr) const;
  // Whether a check from `name` may be due (cheap: asked at every
  // heartbeat; true for a queued direction never measured, whoever is busy).
  bool CheckDue(const std::string& name) const;
  // Queues the direction from `from` to `to` (false: it was queued).
  bool Queue(const std::string& from, const std::string& to);
  // The peers `name` has queued directions to.
  std::vector<std::string> QueuedFrom(const std::string& name) const;
  // `from`'s measurements (LinkRecord::from and measured_at are set here):
  // each ends its queued probe and its claim. One over kProbedSlowdown
  // times slower than the link's previous probe counts as a slowed link
  // towards suspecting its ends (LinkRecord::slowed_from).
  void Record(const std::string& from, std::vector<LinkRecord> links);
  // A job's streams saw the link from `from` to `to` slow down to
  // `bytes_per_second` (LinkRecord::observed_bytes_per_second); a probe of
  // it is queued, which `from` runs once it is idle. The workers this
  // makes suspected (see above; every direction between such a worker and
  // every other is queued: the suspicion ends with the last of them).
  // `before`: the pace it had (the probe's, or earlier in the job's epoch:
  // LinkRecord::fast_before).
  std::vector<std::string> Observe(const std::string& from, const std::string& to, double bytes_per_second,
                                   const std::string& job_id, double before = 0);
  // The link carries its old rate again: its observation goes, and the
  // suspicion of `to`'s own link (its frames arrive at their pace).
  void ForgetObserved(const std::string& from, const std::string& to);
  std::optional<LinkSuspicion> Suspected(const std::string& name) const;
  std::map<std::string, LinkSuspicion> Suspects() const;  // by worker name
  // Forgets links and probes naming a worker not in `known`.
  void Retain(const std::set<std::string>& known);

  std::vector<LinkRecord> Links() const;  // by (from, to)
  std::optional<LinkRecord> Get(const std::string& from, const std::string& to) const;
  bool Stale(const LinkRecord& link) const { return clock_() - link.measured_at > kStaleAfter; }
  int pending() const;  // queued directions, those being probed included
  int probing() const;  // live claims
  // Whether a live claim has an end on `name`'s host (its CPU and wire are
  // in a probe: nothing else measures there now).
  bool HostProbing(const std::string& name) const;
  absl::Time Now() const { return clock_(); }

 private:
  using Direction = std::pair<std::string, std::string>;  // (from, to)
  struct Claimed {
    absl::Time at;
    bool leaves_group = false;  // may leave its link group (when claimed)
    bool alone = false;         // a measurement being taken again, alone
    std::set<Direction> beside;  // the probes that ran at the same time
    bool check = false;          // ClaimCheck's
  };

  void ExpireClaimsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::string& HostLocked(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the measured links show of the hosts (cached until a figure
  // moves them): LinkGroups over hosts, a host to another as fast as the
  // fastest link measured between their workers.
  struct Groups {
    std::map<std::string, int> of;  // worker name → its host's link group (an index, the same for one group)
    std::map<std::pair<std::string, std::string>, double> host_rate;  // (host, host) → bytes/s
    std::map<std::string, double> fastest;  // host → its fastest link out
    std::set<std::pair<int, int>> tried;    // group pairs with a measured direction between them
  };
  const Groups& GroupsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double HostRateLocked(const std::string& from, const std::string& to) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The link `d` now measures `after` bytes/s, `before` before: the groups
  // are kept where that cannot move them (the rate between its hosts stays),
  // else marked stale.
  void KeepGroupsLocked(const Direction& d, double before, double after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LeavesGroupLocked(const Direction& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Suspects `name` if its slowed links reach two peers (true: newly).
  bool MaybeSuspectLocked(const std::string& name, const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A suspect's slowed links are its doing: no evidence against their
  // other ends (cleared once both ends of what was found were weighed).
  void ClearExplainedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `d` (false: it was queued).
  bool QueueLocked(const Direction& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues, to be probed alone, each of `links` (all measured so far, when
  // null) now leaving its group that was measured beside a probe now leaving
  // its group too.
  void RecheckSharedLocked(const std::vector<Direction>* links) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // `d` measured `link` now (`old`: its record before, if any): whether
  // it is in doubt now, or found back (recoveries_).
  void NoteDoubtLocked(const Direction& d, const LinkRecord* old, LinkRecord& link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `link`, in doubt, was found slow again or could not be checked: its
  // next check waits kCheckEvery doubled once more (up to kCheckEveryMost).
  void DeferCheckLocked(LinkRecord& link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock clock_;
  mutable absl::Mutex mu_;
  int concurrent_probes_ ABSL_GUARDED_BY(mu_) = kDefaultConcurrentProbes;
  std::map<std::string, std::string> hosts_ ABSL_GUARDED_BY(mu_);  // worker name → host
  std::map<Direction, LinkRecord> links_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, LinkSuspicion> suspects_ ABSL_GUARDED_BY(mu_);  // by worker name
  uint64_t recoveries_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<LinkRecovery> recovered_ ABSL_GUARDED_BY(mu_);  // the last kRecoveriesKept
  std::set<Direction> queued_ ABSL_GUARDED_BY(mu_);
  std::set<Direction> leaving_ ABSL_GUARDED_BY(mu_);  // the queued that may leave their groups
  std::map<Direction, Claimed> claims_ ABSL_GUARDED_BY(mu_);
  // The probes each measurement ran beside (while it may still have to be
  // taken again), and the directions to probe again alone.
  std::map<Direction, std::set<Direction>> measured_beside_ ABSL_GUARDED_BY(mu_);
  std::set<Direction> alone_ ABSL_GUARDED_BY(mu_);
  Groups groups_ ABSL_GUARDED_BY(mu_);
  // What Claim chose as the one probe that may leave its group, kept while
  // nothing changes (version_ counts the changes).
  struct LeavingChoice {
    uint64_t version = ~uint64_t{0};
    std::set<std::string> unavailable;
    std::optional<Direction> leaving;
  };
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  LeavingChoice choice_ ABSL_GUARDED_BY(mu_);
  bool groups_stale_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_LINK_TABLE_H_
