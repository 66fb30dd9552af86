// One planning's view of the links: each pair estimated once, workers told
// apart by name where their registration orders collide, and as many
// workers as a registry holds (past the matrix, by pair).
#include "server/link_memo.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

WorkerRecord Worker(const std::string& name, int64_t order) {
  WorkerRecord w;
  w.name = name;
  w.order = order;
  return w;
}

class LinkMemoTest : public ::testing::Test {
 protected:
  // Each estimate says which pair it was asked for, as a number.
  LinkMemo memo_{[this](const WorkerRecord& from, const WorkerRecord& to) {
    ++asked_[{from.name, to.name}];
    LinkEstimate e;
    e.bytes_per_second = static_cast<double>(std::hash<std::string>()(from.name + ">" + to.name) % 1000000);
    return e;
  }};
  static double Expected(const std::string& from, const std::string& to) {
    return static_cast<double>(std::hash<std::string>()(from + ">" + to) % 1000000);
  }
  std::map<std::pair<std::string, std::string>, int> asked_;
};

TEST_F(LinkMemoTest, EachPairIsEstimatedOnceAndWorkersSharingAnOrderAreToldApartByName) {
  // Test records leave the order at 0; a registry's differ.
  const std::vector<WorkerRecord> workers = {Worker("a", 0), Worker("b", 0), Worker("c", 7), Worker("d", 0),
                                             Worker("e", 7), Worker("f", -1), Worker("g", int64_t{1} << 40)};
  for (int round = 0; round < 3; ++round) {
    for (const WorkerRecord& from : workers) {
      for (const WorkerRecord& to : workers) {
        EXPECT_EQ(memo_.Get(from, to).bytes_per_second, Expected(from.name, to.name)) << from.name << to.name;
      }
    }
  }
  EXPECT_EQ(memo_.workers(), workers.size());
  EXPECT_EQ(asked_.size(), workers.size() * workers.size());
  for (const auto& [pair, times] : asked_) EXPECT_EQ(times, 1) << pair.first << " -> " << pair.second;
  // A copy of a record (a search swaps copies around) is the same worker.
  WorkerRecord copy = workers[4];
  EXPECT_EQ(memo_.Get(copy, workers[0]).bytes_per_second, Expected("e", "a"));
  EXPECT_EQ(memo_.workers(), workers.size());
}

TEST_F(LinkMemoTest, PastTheMatrixPairsAreKeptByPair) {
  std::vector<WorkerRecord> workers;
  for (uint32_t i = 0; i < LinkMemo::kDense + 40; ++i) workers.push_back(Worker(absl::StrCat("w", i), i + 1));
  for (const WorkerRecord& w : workers) memo_.Get(w, w);  // numbered in order: the last 40 past the matrix
  EXPECT_EQ(memo_.workers(), workers.size());
  // Every 37th against the last 50, twice: both sides of kDense.
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < workers.size(); i += 37) {
      for (size_t j = workers.size() - 50; j < workers.size(); ++j) {
        EXPECT_EQ(memo_.Get(workers[i], workers[j]).bytes_per_second, Expected(workers[i].name, workers[j].name));
        EXPECT_EQ(memo_.Get(workers[j], workers[i]).bytes_per_second, Expected(workers[j].name, workers[i].name));
      }
    }
  }
  for (const auto& [pair, times] : asked_) EXPECT_EQ(times, 1) << pair.first << " -> " << pair.second;
}

}  // namespace
}  // namespace shardline::server
