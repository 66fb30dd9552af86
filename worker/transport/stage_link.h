// StageLink is one pipeline stage's connection to its neighbours: messages
// to the next stage (activations, and the targets the last stage needs) and
// to the previous one (gradients), plus the tiny end-of-step reduction of
// squared gradient norms. Each direction is FIFO; the pipeline schedules
// make the receiving order equal to the sending order, and the receiver
// checks every message against what it expects.
//
// Implementations: LocalStageLink (in-process, tests) and GrpcStageLink
// (the StageLink service between workers). A link serves one stage: its
// thread receives, and sends either itself or through its StageSender's
// thread. Implementations make every method safe to call from those threads
// at once, while the peer's threads do the same.
#ifndef SHARDLINE_WORKER_TRANSPORT_STAGE_LINK_H_
#define SHARDLINE_WORKER_TRANSPORT_STAGE_LINK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "worker/transport/host_buffer.h"
#include "worker/transport/wire_pace.h"

namespace shardline::worker::transport {

struct StageMessage {
  enum class Kind {
    kActivation,  // to next: a micro-batch's output (+ targets, loss scale)
    kGradient,    // to previous: gradient of a micro-batch's input
    kNormPartial, // to next: Σ grad² of stages 0..s
    kNormTotal,   // to previous: Σ grad² of all stages
    kCollective,  // between the ranks of a collective group: a chunk of a call
  };
  Kind kind = Kind::kActivation;
  int64_t step = 0;
  int micro_batch = 0;              // collectives: the chunk carried (a rank; −1: the whole buffer)
  uint64_t sequence = 0;            // collectives: the call's sequence number
  int64_t batch = 0;                // sequences (activations)
  int64_t t = 0;                    // tokens per sequence (activations)
  HostBuffer values;                // activations or gradients, [batch·t·width]
  // What `values` holds: f32, or bf16 / f16 (the wire precision), as
  // values.size() 16-bit values at the start of the buffer. Stages convert on
  // their device; links move the bytes as they are.
  common::DType dtype = common::DType::kF32;
  // Collectives over 8-bit blocks: `values` (f32) encoded
  // (common/int8_blocks.h), sent instead of them; the receiver decodes the
  // same f32 values. Empty: `values` travel as they are.
  std::vector<char> int8_blocks;
  std::vector<int32_t> targets;     // activations: [batch·t], carried to the last stage
  float loss_scale = 0.0f;          // activations: 1 / scored tokens in the step
  // Activations of a validation pass (step −s, after step s): its batches.
  int eval_batches = 0;
  double norm = 0.0;                // norm messages
};

std::string DescribeMessage(const StageMessage& m);

class StageLink {
 public:
  virtual ~StageLink() = default;
  // Each fails with UNAVAILABLE once the link or its peer is gone,
  // DEADLINE_EXCEEDED when the peer does not answer in time, and
  // FAILED_PRECONDITION when the stage has no neighbour on that side.
  virtual absl::Status SendToNext(StageMessage message) = 0;
  virtual absl::StatusOr<StageMessage> ReceiveFromPrevious() = 0;
  virtual absl::Status SendToPrevious(StageMessage message) = 0;
  virtual absl::StatusOr<StageMessage> ReceiveFromNext() = 0;
  // Ends this stage's use of the link, as its process's death would: every
  // wait on it, here and at the neighbours, fails with UNAVAILABLE `reason`
  // from now on, and a send blocked on a neighbour that stopped reading
  // returns.
  virtual void Close(const std::string& reason) = 0;
  // Where to put a tensor of `elements` floats that will be sent as a
  // message of `kind`: a free staging slot of the link when it has one, the
  // heap otherwise. The values are unspecified; the caller fills them all.
  virtual HostBuffer OutgoingBuffer(StageMessage::Kind /*kind*/, size_t elements) {
    return HostBuffer::Zeros(elements);
  }
  // Payload bytes received from both neighbours so far (what crossed the wire;
  // 0 for links that move no bytes).
  virtual uint64_t BytesReceived() { return 0; }
  // What the frames received so far from each neighbour showed of its wire
  // (wire_pace.h; nothing for links without one).
  virtual WirePace PaceFromPrevious() { return {}; }
  virtual WirePace PaceFromNext() { return {}; }
  // The most tensor bytes the link held at once towards each neighbour,
  // summed over the neighbours: messages queued to send and received ones
  // not yet taken (0 for links that hold none of their own).
  virtual uint64_t PeakHeldBytes() { return 0; }
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_STAGE_LINK_H_
