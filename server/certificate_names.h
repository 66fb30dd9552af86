// Binding a worker's registered name to its client certificate (mutual
// TLS): without it any certificate of the cluster's CA may register under
// any worker's name, and so take that worker's assignments. With it
// (shardline-coordinator --tls_worker_names, on by default under TLS) a
// worker registers only under a name its certificate holds, its common
// name or a subject alternative name, or under such a name followed by
// "-" and one more part (several workers of one host under the host's
// certificate: HOST-0, HOST-1, as deploy/systemd names them).
#ifndef SHARDLINE_SERVER_CERTIFICATE_NAMES_H_
#define SHARDLINE_SERVER_CERTIFICATE_NAMES_H_

#include <grpcpp/security/auth_context.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardline::server {

// The names a caller's verified client certificate holds (its common name,
// then its subject alternative names, as gRPC's TLS handshake set them in
// the call's auth context); empty without a verified certificate.
std::vector<std::string> CertificateNames(const grpc::AuthContext* auth);

// OK where `name`, or `name` up to its last "-", is one of `names`;
// PERMISSION_DENIED naming the certificate's names otherwise (none: the
// caller showed no certificate).
absl::Status CheckWorkerName(const std::string& name, const std::vector<std::string>& names);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_CERTIFICATE_NAMES_H_
