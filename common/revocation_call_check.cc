#include "common/revocation_call_check.h"

#include <grpc/grpc_security_constants.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace shardline::common {
namespace {

constexpr size_t kMaxPeers = 1024;
constexpr absl::Duration kLookEvery = absl::Seconds(1);

std::string Utc(absl::Time t) { return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone()); }

}  // namespace

RevocationCallCheck::RevocationCallCheck(std::string dir, std::string ca_path)
    : dir_(std::move(dir)), ca_path_(std::move(ca_path)) {
  absl::MutexLock lock(&mu_);
  Refresh(absl::Now());
}

void RevocationCallCheck::Refresh(absl::Time now) {
  if (now - looked_ < kLookEvery) return;
  looked_ = now;
  // Stamped before reading: a list replaced while it is read is read again.
  std::string stamp = RevocationListsStamp(dir_, ca_path_);
  if (stamp == stamp_) return;
  absl::StatusOr<RevocationSummary> lists = ReadRevocationLists(dir_, ca_path_);
  stamp_ = std::move(stamp);
  // A CA's list gone (a directory emptied to be refilled) would forget what
  // it revoked; the handshake refuses that CA's certificates meanwhile.
  if (lists.ok() && !lists->missing_ca.empty()) {
    lists = absl::NotFoundError(absl::StrCat("no list of CA ", lists->missing_ca));
  }
  if (!lists.ok()) {
    LOG(WARNING) << "--tls_crl_dir: cannot read the revocation lists again (" << lists.status()
                 << "); calls are checked against the lists read before";
    return;
  }
  if (lists->revoked.size() != revoked_.size()) {
    LOG(INFO) << "--tls_crl_dir: " << lists->revoked.size() << " certificates revoked (was " << revoked_.size()
              << "); calls on open connections are checked against them";
  }
  revoked_ = std::move(lists->revoked);
  for (auto& [pem, peer] : peers_) peer.logged = false;
}

absl::Status RevocationCallCheck::Check(absl::string_view pem) {
  absl::MutexLock lock(&mu_);
  Refresh(absl::Now());
  auto it = peers_.find(pem);
  if (it == peers_.end()) {
    absl::StatusOr<CertificateIdentity> identity = IdentifyCertificate(pem);
    // gRPC verified this chain in the handshake; one it cannot parse is no
    // certificate the lists could name.
    if (!identity.ok()) {
      return absl::UnauthenticatedError(absl::StrCat("peer certificate: ", identity.status().message()));
    }
    if (peers_.size() >= kMaxPeers) peers_.clear();
    it = peers_.emplace(std::string(pem), Peer{*std::move(identity)}).first;
  }
  const auto revoked = revoked_.find(it->second.identity.key);
  if (revoked == revoked_.end()) return absl::OkStatus();
  refused_.fetch_add(1, std::memory_order_relaxed);
  Peer& peer = it->second;
  const std::string why = absl::StrCat(kRevokedCertificate, " at ", Utc(revoked->second), " (", peer.identity.subject,
                                       ", serial ", peer.identity.serial, ")");
  if (!peer.logged) {
    LOG(WARNING) << "refusing the calls of a peer on a connection opened before its " << why;
    peer.logged = true;
  }
  return absl::UnauthenticatedError(
      absl::StrCat(why, ": refused by the revocation lists of this server's --tls_crl_dir"));
}

grpc::Status RevocationCallCheck::Process(const InputMetadata& /*auth_metadata*/, grpc::AuthContext* context,
                                          OutputMetadata* /*consumed_auth_metadata*/,
                                          OutputMetadata* /*response_metadata*/) {
  const std::vector<grpc::string_ref> pem = context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) return grpc::Status::OK;
  const absl::Status s = Check(absl::string_view(pem.front().data(), pem.front().size()));
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(s.message()));
}

}  // namespace shardline::common
