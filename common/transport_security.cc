#include "common/transport_security.h"

#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/input_limits.h"
#include "glog/logging.h"

ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of this process (mutual TLS; with --tls_key, --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that signs every Shardline certificate (peers are verified against it)");
ABSL_FLAG(int64_t, tls_refresh_s, 60, "seconds between re-reads of the TLS files (rotation without a restart)");
ABSL_FLAG(bool, tls_verify_hostname, true,
          "check that a server's certificate names the host dialled (false: the CA's signature alone, for hosts "
          "named at start, such as Compose replicas; then use a CA of this cluster's own)");
ABSL_FLAG(std::string, tls_crl_dir, "",
          "directory of certificate revocation lists in OpenSSL's hashed form (deploy/certs.sh DIR --crl, "
          "--revoke NAME): a revoked certificate, or any of a CA whose list is missing or expired, is refused "
          "in the handshake, and a revoked client's calls also on connections it opened before; empty: none "
          "checked");
ABSL_FLAG(bool, insecure, false,
          "plaintext, without TLS: required to listen beyond loopback without --tls_*; for trusted networks only");

namespace shardline::common {
namespace {

absl::Status CheckPem(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFileBounded(path, 1 << 20);
  if (!pem.ok()) return absl::NotFoundError(absl::StrCat("--", flag, ": ", pem.status().message()));
  if (!absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::NotFoundError(absl::StrCat("--", flag, ": ", Quote(path), " holds no PEM block"));
  }
  return absl::OkStatus();
}

}  // namespace

bool TransportSecurity::IsLoopback(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::shared_ptr<TransportSecurity>> TransportSecurity::Create(const TlsFiles& files) {
  const int given = int{!files.cert.empty()} + int{!files.key.empty()} + int{!files.ca.empty()};
  if (given != 0 && given != 3) {
    return absl::InvalidArgumentError("TLS needs all of --tls_cert, --tls_key and --tls_ca");
  }
  if (given == 0 && !files.crl_dir.empty()) {
    return absl::InvalidArgumentError("--tls_crl_dir needs --tls_cert, --tls_key and --tls_ca");
  }
  if (given == 3 && files.insecure) {
    return absl::InvalidArgumentError("--insecure contradicts --tls_cert, --tls_key and --tls_ca");
  }
  if (given == 3 && (files.refresh < absl::Seconds(1) || files.refresh > absl::Hours(24))) {
    return absl::InvalidArgumentError("--tls_refresh_s must be within [1, 86400]");
  }
  std::shared_ptr<TransportSecurity> security(new TransportSecurity(files));
  if (given == 0) return security;
  if (absl::Status s = CheckPem("tls_cert", files.cert); !s.ok()) return s;
  if (absl::Status s = CheckPem("tls_key", files.key); !s.ok()) return s;
  if (absl::Status s = CheckPem("tls_ca", files.ca); !s.ok()) return s;
  if (!files.crl_dir.empty()) {
    const absl::Time now = absl::Now();
    absl::StatusOr<RevocationSummary> lists = CheckRevocationLists(files.crl_dir, files.ca, now);
    if (!lists.ok()) return lists.status();
    security->revocation_ = *lists;
    security->call_check_ = std::make_shared<RevocationCallCheck>(files.crl_dir, files.ca);
    if (lists->next_update - now < kRevocationListWarning) {
      LOG(WARNING) << "--tls_crl_dir: a revocation list in " << files.crl_dir << " expires at "
                   << absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", lists->next_update, absl::UTCTimeZone())
                   << ": every certificate of its CA will be refused then; write a new one (deploy/certs.sh DIR --crl)";
    }
  }
  security->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, static_cast<unsigned int>(absl::ToInt64Seconds(files.refresh)));
  return security;
}

absl::StatusOr<std::shared_ptr<TransportSecurity>> TransportSecurity::FromFlags() {
  TlsFiles files;
  files.cert = absl::GetFlag(FLAGS_tls_cert);
  files.key = absl::GetFlag(FLAGS_tls_key);
  files.ca = absl::GetFlag(FLAGS_tls_ca);
  files.refresh = absl::Seconds(absl::GetFlag(FLAGS_tls_refresh_s));
  files.verify_hostname = absl::GetFlag(FLAGS_tls_verify_hostname);
  files.crl_dir = absl::GetFlag(FLAGS_tls_crl_dir);
  files.insecure = absl::GetFlag(FLAGS_insecure);
  return Create(files);
}

std::shared_ptr<TransportSecurity> TransportSecurity::Plaintext() {
  return std::shared_ptr<TransportSecurity>(new TransportSecurity(TlsFiles{}));
}

absl::Status TransportSecurity::CheckListenAddress(const std::string& address) const {
  if (tls() || files_.insecure || IsLoopback(address)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to listen on ", Quote(address), " in plaintext: give --tls_cert, --tls_key and --tls_ca "
      "(deploy/certs.sh makes them), or --insecure for a network you trust"));
}

std::string TransportSecurity::Describe() const {
  if (tls()) {
    return absl::StrCat("mutual TLS (CA ", files_.ca, ", certificate ", files_.cert,
                        files_.crl_dir.empty()
                            ? ""
                            : absl::StrCat(", revocation lists in ", files_.crl_dir, ": ", revocation_.revoked.size(),
                                           " revoked, next update ",
                                           absl::FormatTime("%Y-%m-%d", revocation_.next_update, absl::UTCTimeZone())),
                        files_.verify_hostname ? ")" : ", server names not checked)");
  }
  return files_.insecure ? "plaintext (--insecure)" : "plaintext (loopback only)";
}

absl::Time TransportSecurity::RevocationNextUpdate() const {
  absl::StatusOr<RevocationSummary> lists = ReadRevocationLists(files_.crl_dir, files_.ca);
  if (!lists.ok() || !lists->missing_ca.empty()) return absl::InfinitePast();
  return lists->next_update;
}

std::shared_ptr<grpc::ServerCredentials> TransportSecurity::ServerCredentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(provider_);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!files_.crl_dir.empty()) options.set_crl_directory(files_.crl_dir);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::experimental::TlsServerCredentials(options);
  // The handshake checks the lists once per connection; this, every call.
  if (call_check_ != nullptr) credentials->SetAuthMetadataProcessor(call_check_);
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> TransportSecurity::ChannelCredentials() const {
  if (!tls()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider_);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);  // the chain, against the CA
  if (!files_.crl_dir.empty()) options.set_crl_directory(files_.crl_dir);
  if (!files_.verify_hostname) {
    options.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
    options.set_check_call_host(false);
  }
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace shardline::common
