// A group of collective ranks for tests, each rank on a thread of this
// process with a backend of its own: the in-process group, or GrpcCollective
// ranks joined by real gRPC streams on loopback (each rank with a
// StageLinkService on a server of its own, as on its own worker).
#ifndef SHARDLINE_TESTS_WORKER_COLLECTIVE_COLLECTIVE_TEST_UTIL_H_
#define SHARDLINE_TESTS_WORKER_COLLECTIVE_COLLECTIVE_TEST_UTIL_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/transport/stage_link_test_util.h"
#include "worker/backend/backend_factory.h"
#include "worker/collective/grpc_collective.h"
#include "worker/collective/in_process_collective.h"

namespace shardline::worker::collective::testing {

struct Ranks {
  std::unique_ptr<InProcessGroup> group;                        // in-process
  std::vector<std::unique_ptr<transport::Server>> servers;     // gRPC, by rank
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Collective>> handles;
  ~Ranks() {
    handles.clear();
    for (auto& s : servers) s->server->Shutdown();
  }
};

// `kind` is "inprocess", "grpc" or "grpc_two_rounds" (every all-reduce in
// two rounds, however small); every call of a rank waits up to `timeout`.
inline std::unique_ptr<Ranks> MakeRanks(const std::string& kind, const std::string& device, int ranks,
                                        absl::Duration timeout) {
  auto out = std::make_unique<Ranks>();
  for (int r = 0; r < ranks; ++r) {
    auto backend = CreateBackend(device, {1});
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return nullptr;
    out->backends.push_back(std::move(*backend));
  }
  if (kind == "inprocess") {
    auto group = InProcessGroup::Create(ranks, timeout);
    EXPECT_TRUE(group.ok()) << group.status();
    if (!group.ok()) return nullptr;
    out->group = std::move(*group);
    for (int r = 0; r < ranks; ++r) out->handles.push_back(out->group->Rank(r, *out->backends[r]));
    return out;
  }
  std::vector<std::string> addresses;
  for (int r = 0; r < ranks; ++r) {
    out->servers.push_back(transport::StartServer());
    addresses.push_back(out->servers.back()->address);
  }
  for (int r = 0; r < ranks; ++r) {
    GrpcCollectiveOptions o;
    o.job_id = "job-1";
    o.plan_epoch = 7;
    o.group = "stage-0";
    o.rank = r;
    o.peer_addresses = addresses;
    o.service = out->servers[r]->service.get();
    o.exchange = transport::Exchange(timeout);  // 1000-byte chunks: many frames per message
    o.staging_slot_bytes = 2048;               // small chunks in slots, larger ones on the heap
    if (kind == "grpc_two_rounds") o.one_round_bytes = 0;
    auto handle = GrpcCollective::Create(*out->backends[r], o);
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (!handle.ok()) return nullptr;
    out->handles.push_back(std::move(*handle));
  }
  return out;
}

// Runs `body(rank, collective, backend)` on one thread per rank, started
// last rank first so that the ranks arrive in another order than theirs.
inline void RunRanks(Ranks& ranks, const std::function<void(int, Collective&, Backend&)>& body) {
  std::vector<std::thread> threads;
  const int d = static_cast<int>(ranks.handles.size());
  for (int r = d - 1; r >= 0; --r) {
    threads.emplace_back([&, r] { body(r, *ranks.handles[r], *ranks.backends[r]); });
  }
  for (auto& t : threads) t.join();
}

}  // namespace shardline::worker::collective::testing

#endif  // SHARDLINE_TESTS_WORKER_COLLECTIVE_COLLECTIVE_TEST_UTIL_H_
