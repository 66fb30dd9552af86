// TransportSecurity: how a Shardline process protects its gRPC channels,
// from its flags (every daemon and shardctl share them):
//   --tls_cert, --tls_key, --tls_ca  PEM files: this process's certificate
//                                    chain and key, and the CA that signs
//                                    every Shardline certificate;
//   --tls_refresh_s                  how often the files are read again (a
//                                    rotated certificate is used without a
//                                    restart: gRPC's file-watcher provider);
//   --tls_verify_hostname            clients check the server's name (default);
//   --tls_crl_dir                    revocation lists checked in every handshake
//                                    and, by servers, on every call;
//   --insecure                       plaintext, knowingly.
// With TLS, servers require and verify a client certificate from the CA
// (mutual TLS, REQUIRE_AND_VERIFY) and clients verify the server's
// certificate and host name. Plaintext is allowed only on loopback unless
// --insecure says otherwise (CheckListenAddress). Thread-safe; shared by
// every channel and server of the process.
#ifndef SHARDLINE_COMMON_TRANSPORT_SECURITY_H_
#define SHARDLINE_COMMON_TRANSPORT_SECURITY_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/revocation_call_check.h"
#include "common/revocation_lists.h"

namespace shardline::common {

// A revocation list expiring sooner than this is warned about at start.
inline constexpr absl::Duration kRevocationListWarning = absl::Hours(7 * 24);

struct TlsFiles {
  std::string cert;  // PEM certificate chain of this process
  std::string key;   // PEM private key
  std::string ca;    // PEM CA bundle that signs every peer
  absl::Duration refresh = absl::Seconds(60);
  // Clients check that the server's certificate names the host they dialled
  // (false: the CA's signature alone, for clusters whose hosts get names
  // only at start: Compose replicas, Kubernetes pods; use a CA of the
  // cluster's own then, since any certificate it signed passes).
  bool verify_hostname = true;
  // Certificate revocation lists, OpenSSL's hashed form (empty: none):
  // every CA of `ca` must have one there, not expired (CheckRevocationLists).
  std::string crl_dir;
  bool insecure = false;  // no TLS, and the operator said so
};

class TransportSecurity {
 public:
  // All three files, or none with `insecure` (or none at all: plaintext,
  // which CheckListenAddress confines to loopback). INVALID_ARGUMENT for
  // some but not all, or with --insecure; NOT_FOUND for a file that cannot
  // be read or holds no PEM block; CheckRevocationLists' errors for a
  // `crl_dir` that would refuse every peer. Nothing is allocated for the
  // channels until every file checks out.
  static absl::StatusOr<std::shared_ptr<TransportSecurity>> Create(const TlsFiles& files);
  // From the --tls_* and --insecure flags (DEFINEd by transport_security.cc).
  static absl::StatusOr<std::shared_ptr<TransportSecurity>> FromFlags();
  // Plaintext everywhere: tests and tools that run on loopback.
  static std::shared_ptr<TransportSecurity> Plaintext();

  bool tls() const { return provider_ != nullptr; }
  bool insecure() const { return files_.insecure; }
  // Whether `address` (host:port) is on loopback (127.0.0.0/8, ::1, localhost).
  static bool IsLoopback(const std::string& address);
  // Refuses to serve plaintext on an address beyond loopback unless
  // --insecure was given (FAILED_PRECONDITION naming the flags).
  absl::Status CheckListenAddress(const std::string& address) const;
  // Whether handshakes check revocation lists (--tls_crl_dir).
  bool checks_revocation() const { return tls() && !files_.crl_dir.empty(); }
  // The revocation lists' next update read now (ReadRevocationLists: they
  // may have been replaced since the start); InfinitePast where they cannot
  // be read or a CA has none: every peer of that CA is refused.
  absl::Time RevocationNextUpdate() const;
  // Calls its servers refused for a revoked client certificate on a
  // connection opened before the revocation (RevocationCallCheck).
  int64_t RevokedCallsRefused() const { return call_check_ != nullptr ? call_check_->refused() : 0; }
  // One line for the start-up log: "mutual TLS (CA …, certificate …)" or
  // "plaintext (--insecure)".
  std::string Describe() const;

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

 private:
  explicit TransportSecurity(TlsFiles files) : files_(std::move(files)) {}
  const TlsFiles files_;
  RevocationSummary revocation_;  // of files_.crl_dir, checked at Create
  // Every call a server takes checked against files_.crl_dir (null: none).
  std::shared_ptr<RevocationCallCheck> call_check_;
  std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> provider_;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_TRANSPORT_SECURITY_H_
