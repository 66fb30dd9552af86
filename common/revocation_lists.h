// RevocationLists: what a --tls_crl_dir holds for the CAs of a --tls_ca
// bundle, read the way OpenSSL reads it in a handshake (files HASH.rN, each
// a PEM certificate revocation list). A CA with no list there, or whose
// newest list is past its next update, makes OpenSSL refuse every
// certificate it signed: a daemon checks at start and refuses to start
// instead of refusing every peer (TransportSecurity::Create).
#ifndef SHARDLINE_COMMON_REVOCATION_LISTS_H_
#define SHARDLINE_COMMON_REVOCATION_LISTS_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardline::common {

struct RevocationSummary {
  // The certificates the CAs' newest lists revoke, by CertificateKey: when.
  absl::flat_hash_map<std::string, absl::Time> revoked;
  // The earliest of the CAs' newest lists' next updates (after it the
  // daemons refuse every certificate of that CA), and that CA.
  absl::Time next_update = absl::InfiniteFuture();
  std::string next_update_ca;
  std::string missing_ca;  // a CA of the bundle with no list (empty: none)
};

// Reads `dir` (files named HASH.rN) against the CA certificates of the PEM
// bundle `ca_path`. NOT_FOUND: no directory, no CA in the bundle;
// INVALID_ARGUMENT: a HASH.rN file that is not a PEM revocation list, or
// one no CA of the bundle signed.
absl::StatusOr<RevocationSummary> ReadRevocationLists(const std::string& dir, const std::string& ca_path);

// ReadRevocationLists, and FAILED_PRECONDITION where a CA has no list or
// its newest list expired before `now` (naming it and when).
absl::StatusOr<RevocationSummary> CheckRevocationLists(const std::string& dir, const std::string& ca_path,
                                                        absl::Time now);

// What changes when a list or the bundle is replaced: the names, sizes and
// modification times of `dir`'s HASH.rN files and of `ca_path` (a file
// that cannot be looked at is left out).
std::string RevocationListsStamp(const std::string& dir, const std::string& ca_path);

// A certificate as revocation lists name it: its issuer and serial number.
struct CertificateIdentity {
  std::string key;      // issuer and serial: RevocationSummary::revoked's key
  std::string subject;  // e.g. "/CN=w7", for messages
  std::string serial;   // hex
};

// The identity of the first certificate of a PEM chain (a peer's, as gRPC
// hands it over); INVALID_ARGUMENT where `pem` holds none.
absl::StatusOr<CertificateIdentity> IdentifyCertificate(absl::string_view pem);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_REVOCATION_LISTS_H_
