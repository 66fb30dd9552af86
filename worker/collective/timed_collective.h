// TimedCollective wraps a rank's Collective and adds up the wall time its
// calls take (the tensor-parallel all-reduces sit on a step's critical
// path: their time is exposed). For the worker's metrics and
// bench_pipeline. Not thread-safe, as a rank's Collective (one thread calls
// it).
#ifndef SHARDLINE_WORKER_COLLECTIVE_TIMED_COLLECTIVE_H_
#define SHARDLINE_WORKER_COLLECTIVE_TIMED_COLLECTIVE_H_

#include <chrono>
#include <string>

#include "worker/collective/collective.h"

namespace shardline::worker::collective {

class TimedCollective final : public Collective {
 public:
  explicit TimedCollective(Collective& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::Status AllReduceSum(DeviceSpan<float> data) override {
    return Time([&] { return inner_.AllReduceSum(data); });
  }
  absl::Status ReduceScatterSum(DeviceSpan<float> data) override {
    return Time([&] { return inner_.ReduceScatterSum(data); });
  }
  absl::Status AllGather(DeviceSpan<float> data) override {
    return Time([&] { return inner_.AllGather(data); });
  }
  absl::Status Broadcast(DeviceSpan<float> data, int root) override {
    return Time([&] { return inner_.Broadcast(data, root); });
  }
  absl::Status AllReduceSumHost(absl::Span<float> data) override {
    return Time([&] { return inner_.AllReduceSumHost(data); });
  }
  absl::Status ReduceScatterSumHost(absl::Span<float> data) override {
    return Time([&] { return inner_.ReduceScatterSumHost(data); });
  }
  absl::Status AllGatherHost(absl::Span<float> data) override {
    return Time([&] { return inner_.AllGatherHost(data); });
  }
  absl::Status AllReduceSumHostInt8(absl::Span<float> data, absl::Span<float> residual) override {
    return Time([&] { return inner_.AllReduceSumHostInt8(data, residual); });
  }
  absl::Status ReduceScatterSumHostInt8(absl::Span<float> data, absl::Span<float> residual) override {
    return Time([&] { return inner_.ReduceScatterSumHostInt8(data, residual); });
  }
  absl::Status AllReduceSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) override {
    return Time([&] { return inner_.AllReduceSumHostParts(data, held); });
  }
  absl::Status ReduceScatterSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) override {
    return Time([&] { return inner_.ReduceScatterSumHostParts(data, held); });
  }
  void Close(const std::string& reason) override { inner_.Close(reason); }
  uint64_t BytesReceived() override { return inner_.BytesReceived(); }
  transport::WirePace PaceFrom(int peer) override { return inner_.PaceFrom(peer); }

  double seconds() const { return seconds_; }

 private:
  template <typename Call>
  absl::Status Time(const Call& call) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = call();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return status;
  }

  Collective& inner_;
  double seconds_ = 0;
};

}  // namespace shardline::worker::collective

#endif  // SHARDLINE_WORKER_COLLECTIVE_TIMED_COLLECTIVE_H_
