// RevocationCallCheck: refuses every call whose client certificate the
// revocation lists of --tls_crl_dir revoke, also on a connection opened
// before the revocation. gRPC checks the lists in the TLS handshake only,
// and an HTTP/2 connection lives as long as its peer keeps it: a worker
// whose certificate leaked would otherwise go on registering, reporting
// and linking over the connections it already had. A server's credentials
// take it as their AuthMetadataProcessor (TransportSecurity), so it runs
// before any method: the call ends UNAUTHENTICATED with kRevokedCertificate
// in its message. Streams already open run to their end (a revoked
// worker's job fails over when its lease lapses: its heartbeats are
// refused). The directory is read again when its lists or the CA bundle
// changed (names, sizes, modification times; looked at no more than once a
// second); lists that cannot be read then keep the ones read before, with
// a warning. Thread-safe.
#ifndef SHARDLINE_COMMON_REVOCATION_CALL_CHECK_H_
#define SHARDLINE_COMMON_REVOCATION_CALL_CHECK_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/revocation_lists.h"

namespace shardline::common {

// In the message of a call refused for a revoked certificate: what a client
// looks for to tell it from a missing token (and to connect again with a
// certificate that may have been replaced).
inline constexpr absl::string_view kRevokedCertificate = "certificate was revoked";

class RevocationCallCheck : public grpc::AuthMetadataProcessor {
 public:
  // Reads `dir` against the bundle `ca_path` (both checked by
  // CheckRevocationLists before: a start that gets here has lists).
  RevocationCallCheck(std::string dir, std::string ca_path);

  // OK, or UNAUTHENTICATED where the first certificate of `pem` (a peer's
  // chain, PEM) is revoked by the lists as they are now.
  absl::Status Check(absl::string_view pem);
  // Calls refused so far (a Prometheus counter).
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

  // The call's peer certificate (x509_pem_cert) through Check; a call with
  // none (plaintext) passes: the handshake decided about it.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;

 private:
  // Reads the lists again where their stamp changed (at most once a second).
  void Refresh(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const std::string ca_path_;
  std::atomic<int64_t> refused_{0};
  absl::Mutex mu_;
  absl::Time looked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string stamp_ ABSL_GUARDED_BY(mu_);  // RevocationListsStamp at the last read
  absl::flat_hash_map<std::string, absl::Time> revoked_ ABSL_GUARDED_BY(mu_);
  // Peers' certificates (PEM) already parsed, and whether a refusal of
  // each was logged (at most kMaxPeers; then forgotten and parsed again).
  struct Peer {
    CertificateIdentity identity;
    bool logged = false;
  };
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_REVOCATION_CALL_CHECK_H_
