#include "common/eval_shares.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

TEST(EvalSharesTest, ReplicasTakeEveryDthBatch) {
  EXPECT_EQ(EvalShare(7, 0, 3), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(EvalShare(7, 1, 3), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(EvalShare(7, 2, 3), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(EvalShare(7, 0, 1).size(), 7u);
  EXPECT_TRUE(EvalShare(2, 3, 4).empty()) << "fewer batches than replicas";
}

// Added back in batch order: the bits of one process adding them one by
// one, for any number of replicas (values whose sum depends on the order).
TEST(EvalSharesTest, SharesAddUpInBatchOrder) {
  const std::vector<double> losses = {1e16, 1.0, -1e16, 0.5, 3.25, 1e-3, 7.0};
  double want = 0.0;
  for (double loss : losses) want += loss;
  for (int d = 1; d <= 9; ++d) {
    std::vector<std::vector<double>> shares(static_cast<size_t>(d));
    for (int r = 0; r < d; ++r) {
      for (int64_t i : EvalShare(static_cast<int64_t>(losses.size()), r, d)) shares[r].push_back(losses[i]);
    }
    std::vector<absl::Span<const double>> spans(shares.begin(), shares.end());
    auto sum = SumEvalShares(spans);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, want) << d << " replicas";
  }
  std::vector<double> partial(3, 0.0);  // adding 3 replicas' partial sums instead
  for (size_t i = 0; i < losses.size(); ++i) partial[i % 3] += losses[i];
  EXPECT_NE(partial[0] + partial[1] + partial[2], want) << "the test's values must tell the orders apart";
}

TEST(EvalSharesTest, SharesOfTheWrongSizesAreRefused) {
  const std::vector<double> three = {1, 2, 3}, one = {4};
  auto sum = SumEvalShares({absl::MakeConstSpan(one), absl::MakeConstSpan(three)});
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().message().find("replica 0 of 2 reported 1 validation batches where a pass of 4 gives it 2"),
            std::string::npos)
      << sum.status();
  EXPECT_EQ(*SumEvalShares({}), 0.0);
  EXPECT_EQ(*SumEvalShares({absl::Span<const double>(), absl::Span<const double>()}), 0.0);
}

}  // namespace
}  // namespace shardline::common
