// SlotStore keeps one layer's saved activations per micro-batch slot, and
// recycles released ones so that steady-state training allocates nothing.
// `Saved` is a struct of DeviceBuffers. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_SLOT_STORE_H_
#define SHARDLINE_WORKER_NN_SLOT_STORE_H_

#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/backend.h"

namespace shardline::worker::nn {

// Makes `buffer` hold at least `floats` floats (contents undefined).
inline absl::Status EnsureFloats(Backend& backend, DeviceBuffer& buffer, size_t floats) {
  if (buffer.bytes() >= floats * sizeof(float)) return absl::OkStatus();
  absl::StatusOr<DeviceBuffer> fresh = backend.Allocate(floats * sizeof(float));
  if (!fresh.ok()) return fresh.status();
  buffer = std::move(*fresh);
  return absl::OkStatus();
}

template <typename Saved>
class SlotStore {
 public:
  // A fresh or recycled Saved for `slot`; ALREADY_EXISTS if the slot is live.
  absl::StatusOr<Saved*> Acquire(int slot) {
    if (live_.count(slot)) {
      return absl::AlreadyExistsError(absl::StrCat("micro-batch slot ", slot, " is already held"));
    }
    Saved saved;
    if (!spare_.empty()) {
      saved = std::move(spare_.back());
      spare_.pop_back();
    }
    return &live_.emplace(slot, std::move(saved)).first->second;
  }
  // The live Saved of `slot`; FAILED_PRECONDITION if there is none.
  absl::StatusOr<Saved*> Find(int slot) {
    auto it = live_.find(slot);
    if (it == live_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no forward pass is held for micro-batch slot ", slot));
    }
    return &it->second;
  }
  void Release(int slot) {
    auto it = live_.find(slot);
    if (it == live_.end()) return;
    spare_.push_back(std::move(it->second));
    live_.erase(it);
  }
  bool holds(int slot) const { return live_.count(slot) > 0; }
  size_t live() const { return live_.size(); }

 private:
  std::map<int, Saved> live_;
  std::vector<Saved> spare_;
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_SLOT_STORE_H_
