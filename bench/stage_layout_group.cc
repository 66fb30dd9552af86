#include "bench/stage_layout_group.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/loopback_server.h"
#include "bench/net_util.h"
#include "worker/backend/backend_factory.h"
#include "worker/collective/grpc_collective.h"
#include "worker/transport/grpc_stage_link.h"

namespace shardline::bench {

const char* StageLayoutName(StageLayout layout) {
  switch (layout) {
    case StageLayout::kSameRank:
      return "same_rank";
    case StageLayout::kScatterGather:
      return "scatter_gather";
    case StageLayout::kBroadcast:
      return "broadcast";
  }
  return "?";
}

namespace {

using worker::collective::ChunkOf;
using worker::transport::StageMessage;

// One rank of the receiving stage: its server and service, its link to the
// sending rank of its index, its buffer, and its part of every group size's
// collective.
struct Receiver {
  std::unique_ptr<worker::transport::StageLinkService> service =
      std::make_unique<worker::transport::StageLinkService>();
  LoopbackServer server;
  std::unique_ptr<worker::Backend> backend;
  std::unique_ptr<worker::transport::GrpcStageLink> link;
  worker::DeviceBuffer buffer;
  std::map<int, std::unique_ptr<worker::collective::GrpcCollective>> groups;  // by group size
};

bool Fail(const absl::Status& status, const char* what) {
  if (status.ok()) return false;
  std::fprintf(stderr, "receiving group: %s: %s\n", what, status.ToString().c_str());
  return true;
}

// One round of a case on rank k: every tensor taken in, put together as
// the layout says, acked; the last one checked. False on an error.
bool ReceiveRound(Receiver& me, int k, const LayoutCase& c, int round, std::atomic<bool>& correct) {
  const size_t n = c.bytes / sizeof(float);
  auto whole = me.buffer.span<float>().subspan(0, n);
  for (int rep = 0; rep < c.reps; ++rep) {
    std::vector<float> got;
    const bool receives = c.layout != StageLayout::kBroadcast || k == 0;
    absl::StatusOr<StageMessage> m = receives ? me.link->ReceiveFromPrevious() : absl::StatusOr<StageMessage>(StageMessage());
    if (Fail(m.status(), "receive")) return false;
    if (c.layout == StageLayout::kSameRank) {
      if (m->values.size() != n) return Fail(absl::InternalError("a tensor of the wrong size"), "receive");
      if (rep + 1 == c.reps) got.assign(m->values.data(), m->values.data() + n);
    } else {
      const worker::collective::Chunk chunk =
          c.layout == StageLayout::kScatterGather ? ChunkOf(n, c.ranks, k) : worker::collective::Chunk{0, n};
      if (receives) {
        if (m->values.size() != chunk.size()) return Fail(absl::InternalError("a part of the wrong size"), "receive");
        const absl::Span<const float> part(m->values.data(), chunk.size());
        if (Fail(me.backend->CopyToDevice(part, whole.subspan(chunk.begin, chunk.size())), "copy in")) return false;
      }
      worker::collective::GrpcCollective& group = *me.groups.at(c.ranks);
      const absl::Status status =
          c.layout == StageLayout::kScatterGather ? group.AllGather(whole) : group.Broadcast(whole, 0);
      if (Fail(status, "collective")) return false;
      if (rep + 1 == c.reps) {
        got.resize(n);
        if (Fail(me.backend->CopyToHost(worker::DeviceSpan<const float>(whole), absl::Span<float>(got)), "copy out")) {
          return false;
        }
      }
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != LayoutValue(i, round, rep)) {
        std::fprintf(stderr, "receiving group: rank %d, %s: element %zu is %g, not %g\n", k,
                     StageLayoutName(c.layout), i, got[i], LayoutValue(i, round, rep));
        correct = false;
        break;
      }
    }
    StageMessage ack;
    ack.kind = StageMessage::Kind::kGradient;
    ack.step = round;
    ack.micro_batch = rep;
    if (Fail(me.link->SendToPrevious(std::move(ack)), "ack")) return false;
  }
  return true;
}

}  // namespace

int RunReceivingGroup(const StageLayoutConfig& config, int ports_pipe, int counts_pipe) {
  if (!config.netns.empty() && !EnterNetns(config.netns)) return 1;
  std::vector<int> ports(static_cast<size_t>(config.largest_ranks));
  const ssize_t want = static_cast<ssize_t>(ports.size() * sizeof(int));
  if (::read(ports_pipe, ports.data(), static_cast<size_t>(want)) != want) return 1;
  std::vector<Receiver> ranks(static_cast<size_t>(config.largest_ranks));
  for (size_t k = 0; k < ranks.size(); ++k) {
    Receiver& me = ranks[k];
    me.server = StartLoopbackServer(*me.service, config.ip);
    auto backend = worker::CreateBackend("cpu", {1});
    if (Fail(backend.status(), "backend")) return 1;
    me.backend = std::move(*backend);
    auto buffer = me.backend->Allocate(config.largest_bytes);
    if (Fail(buffer.status(), "buffer")) return 1;
    me.buffer = std::move(*buffer);
    worker::transport::GrpcStageLinkOptions link;
    link.job_id = "bench";
    link.plan_epoch = 1;
    link.stage = 1;
    link.stages = 2;
    link.upstream_address = absl::StrCat(config.sender_ip, ":", ports[k]);
    link.exchange = config.exchange;
    link.staging_slot_bytes = config.largest_bytes;
    auto created = worker::transport::GrpcStageLink::Create(link);
    if (Fail(created.status(), "link")) return 1;
    me.link = std::move(*created);
  }
  for (const LayoutCase& c : config.cases) {
    if (c.layout == StageLayout::kSameRank || ranks[0].groups.count(c.ranks) > 0) continue;
    std::vector<std::string> peers;
    for (int k = 0; k < c.ranks; ++k) peers.push_back(ranks[static_cast<size_t>(k)].server.address);
    for (int k = 0; k < c.ranks; ++k) {
      Receiver& me = ranks[static_cast<size_t>(k)];
      worker::collective::GrpcCollectiveOptions group;
      group.job_id = "bench";
      group.plan_epoch = 1;
      group.group = absl::StrCat("tensor-", c.ranks);
      group.rank = k;
      group.peer_addresses = peers;
      group.service = me.service.get();
      group.exchange = config.exchange;
      group.staging_slot_bytes = config.largest_bytes;
      auto collective = worker::collective::GrpcCollective::Create(*me.backend, group);
      if (Fail(collective.status(), "collective")) return 1;
      me.groups[c.ranks] = std::move(*collective);
    }
  }
  auto counts = [&] {
    LayoutCounts out;
    for (Receiver& me : ranks) {
      out.link_bytes += me.link->BytesReceived();
      for (auto& [size, group] : me.groups) out.collective_bytes += group->BytesReceived();
    }
    return out;
  };
  // Every byte received belongs to a case, in order: the sender starts a
  // case only once it has this process's counts of the one before (counted
  // before they are written), but may start the first before we get here.
  LayoutCounts before;
  for (const LayoutCase& c : config.cases) {
    std::atomic<bool> correct{true}, ok{true};
    for (int round = 0; round <= config.trials; ++round) {
      std::vector<std::thread> threads;
      for (int k = 0; k < c.ranks; ++k) {
        threads.emplace_back([&, k] {
          if (!ReceiveRound(ranks[static_cast<size_t>(k)], k, c, round, correct)) ok = false;
        });
      }
      for (auto& thread : threads) thread.join();
      if (!ok) return 1;
    }
    const LayoutCounts now = counts();
    LayoutCounts in_case = now;
    in_case.link_bytes -= before.link_bytes;
    in_case.collective_bytes -= before.collective_bytes;
    in_case.correct = correct ? 1 : 0;
    before = now;
    if (::write(counts_pipe, &in_case, sizeof(in_case)) != sizeof(in_case)) return 1;
  }
  // The sender closes its links when it is done: wait for that, then go.
  (void)ranks[0].link->ReceiveFromPrevious();
  for (Receiver& me : ranks) {
    me.groups.clear();
    me.link.reset();
    me.server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  return 0;
}

}  // namespace shardline::bench
