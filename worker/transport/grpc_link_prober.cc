#include "worker/transport/grpc_link_prober.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/median.h"
#include "common/status_macros.h"
#include "shardline/v1/link_probe.grpc.pb.h"

namespace shardline::worker::transport {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Streams `bytes` to the peer's Sink; the seconds it took, receipt included.
absl::StatusOr<double> Transfer(shardline::v1::LinkProbe::Stub& stub, int64_t bytes, const LinkProbeOptions& options,
                                absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  shardline::v1::LinkProbeReceipt receipt;
  shardline::v1::LinkProbeChunk chunk;
  chunk.mutable_payload()->assign(static_cast<size_t>(std::min(bytes, options.chunk_bytes)), '\x5a');
  const Clock::time_point start = Clock::now();
  std::unique_ptr<grpc::ClientWriter<shardline::v1::LinkProbeChunk>> writer = stub.Sink(&context, &receipt);
  for (int64_t sent = 0; sent < bytes;) {
    const int64_t n = std::min(bytes - sent, options.chunk_bytes);
    if (n < static_cast<int64_t>(chunk.payload().size())) chunk.mutable_payload()->resize(static_cast<size_t>(n));
    if (!writer->Write(chunk)) break;  // the stream broke: Finish says why
    sent += n;
  }
  writer->WritesDone();
  RETURN_IF_ERROR(common::FromGrpcStatus(writer->Finish()));
  const double seconds = SecondsSince(start);
  if (receipt.bytes() != bytes) {
    return absl::DataLossError(absl::StrCat("the peer received ", receipt.bytes(), " of ", bytes, " bytes"));
  }
  return seconds;
}

}  // namespace

absl::StatusOr<LinkProbeResult> ProbeLink(const std::string& address,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials,
                                          const LinkProbeOptions& options, const std::atomic<bool>& cancelled) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  const absl::Time deadline = absl::Now() + options.deadline;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, not a link's
  auto stub = shardline::v1::LinkProbe::NewStub(grpc::CreateCustomChannel(address, credentials, args));

  // Round trips: the first opens the connection (and TLS), not counted.
  std::vector<double> rtts;
  for (int i = 0; i <= options.pings; ++i) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(10))));
    shardline::v1::LinkPing ping, pong;
    const Clock::time_point start = Clock::now();
    RETURN_IF_ERROR(common::FromGrpcStatus(stub->Ping(&context, ping, &pong)));
    if (i > 0) rtts.push_back(SecondsSince(start));
  }
  LinkProbeResult result;
  result.rtt_seconds = common::Median(rtts);

  // Bandwidth: grow the transfer until it takes long enough to time.
  int64_t bytes = options.first_transfer_bytes;
  double seconds = 0;
  for (;;) {
    if (cancelled) return absl::CancelledError("the link probe was cancelled");
    ASSIGN_OR_RETURN(seconds, Transfer(*stub, bytes, options, deadline));
    if (seconds >= options.min_transfer_seconds || bytes >= options.max_transfer_bytes) break;
    bytes = std::min(bytes * 4, options.max_transfer_bytes);
  }
  auto rate = [&](double s) { return static_cast<double>(bytes) / std::max(s - result.rtt_seconds, s / 2); };
  std::vector<double> rates = {rate(seconds)};
  while (static_cast<int>(rates.size()) < options.transfers) {
    if (cancelled) return absl::CancelledError("the link probe was cancelled");
    ASSIGN_OR_RETURN(seconds, Transfer(*stub, bytes, options, deadline));
    rates.push_back(rate(seconds));
  }
  result.bytes_per_second = common::Median(rates);
  const auto [slowest, fastest] = std::minmax_element(rates.begin(), rates.end());
  result.spread = (*fastest - *slowest) / result.bytes_per_second;
  result.transfer_bytes = bytes;
  return result;
}

}  // namespace shardline::worker::transport
