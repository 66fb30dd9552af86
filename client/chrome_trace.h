// ChromeTraceJson writes a job's trace (Admin.GetTrace) in the Chrome Trace
// Event format that Perfetto (ui.perfetto.dev) and chrome://tracing open:
// one process per position ("stage 1 · replica 0 · rank 0 (w1)"), on its
// thread a complete event ("ph": "X") per step holding the step's spans
// (forward, backward, receive, send, norm, reduce, optimizer, gather,
// flush; args: step, micro_batch, plan_epoch). Times in microseconds from
// the earliest span (its Unix time in otherData.origin_unix_us); each
// worker's own clock, so positions on different machines are as aligned as
// their clocks are.
#ifndef SHARDLINE_CLIENT_CHROME_TRACE_H_
#define SHARDLINE_CLIENT_CHROME_TRACE_H_

#include <string>

#include "shardline/v1/admin.pb.h"

namespace shardline::client {

std::string ChromeTraceJson(const shardline::v1::GetTraceResponse& trace);

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_CHROME_TRACE_H_
