// LocalStageLink connects the stages of a pipeline that runs inside one
// process (threads): bounded FIFO channels between neighbours, with a
// deadline on every wait so that a stuck or dead neighbour becomes an error,
// never a hang. CreateLocalStageLinks(p) returns one link per stage.
// Thread-safe as StageLink requires.
#ifndef SHARDLINE_WORKER_TRANSPORT_LOCAL_STAGE_LINK_H_
#define SHARDLINE_WORKER_TRANSPORT_LOCAL_STAGE_LINK_H_

#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "worker/transport/stage_link.h"

namespace shardline::worker::transport {

// A bounded FIFO of messages between two threads. Push blocks while full and
// Pop while empty, each up to `timeout`. Close() wakes everyone: later calls
// fail with UNAVAILABLE carrying the reason.
class LocalChannel {
 public:
  LocalChannel(size_t capacity, absl::Duration timeout) : capacity_(capacity), timeout_(timeout) {}

  absl::Status Push(StageMessage message);
  absl::StatusOr<StageMessage> Pop();
  void Close(const std::string& reason);

 private:
  const size_t capacity_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::deque<StageMessage> queue_ ABSL_GUARDED_BY(mu_);
  std::string closed_ ABSL_GUARDED_BY(mu_);  // non-empty once closed
};

class LocalStageLink final : public StageLink {
 public:
  // Channels may be null where the stage has no neighbour. Not owned.
  LocalStageLink(LocalChannel* to_next, LocalChannel* from_next, LocalChannel* to_previous,
                 LocalChannel* from_previous)
      : to_next_(to_next), from_next_(from_next), to_previous_(to_previous),
        from_previous_(from_previous) {}

  absl::Status SendToNext(StageMessage message) override;
  absl::StatusOr<StageMessage> ReceiveFromPrevious() override;
  absl::Status SendToPrevious(StageMessage message) override;
  absl::StatusOr<StageMessage> ReceiveFromNext() override;
  // Closes this stage's channels (both ways, to both neighbours).
  void Close(const std::string& reason) override;

 private:
  LocalChannel* const to_next_;
  LocalChannel* const from_next_;
  LocalChannel* const to_previous_;
  LocalChannel* const from_previous_;
};

// The channels and links of a p-stage in-process pipeline.
struct LocalPipelineLinks {
  std::vector<std::unique_ptr<LocalChannel>> channels;
  std::vector<std::unique_ptr<LocalStageLink>> links;  // links[s] for stage s
  // Closes every channel: each stage's next wait fails with `reason`.
  void CloseAll(const std::string& reason);
};

LocalPipelineLinks CreateLocalStageLinks(int stages, size_t capacity, absl::Duration timeout);

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_LOCAL_STAGE_LINK_H_
