#include "server/certificate_names.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardline::server {

std::vector<std::string> CertificateNames(const grpc::AuthContext* auth) {
  std::vector<std::string> names;
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      std::string name(value.data(), value.size());
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
    }
  }
  return names;
}

absl::Status CheckWorkerName(const std::string& name, const std::vector<std::string>& names) {
  auto held = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  const size_t dash = name.rfind('-');
  const bool suffixed = dash != std::string::npos && dash > 0 && dash + 1 < name.size();
  if (!name.empty() && (held(name) || (suffixed && held(name.substr(0, dash))))) {
    return absl::OkStatus();
  }
  if (names.empty()) {
    return absl::PermissionDeniedError(absl::StrCat("worker \"", name,
                                                    "\" showed no client certificate; the coordinator binds worker "
                                                    "names to certificates (--tls_worker_names)"));
  }
  // A certificate may hold many names: the message stays short.
  constexpr size_t kNamesTold = 8;
  std::string told = absl::StrJoin(names.begin(), names.begin() + std::min(names.size(), kNamesTold), ", ");
  if (names.size() > kNamesTold) absl::StrAppend(&told, " and ", names.size() - kNamesTold, " more");
  return absl::PermissionDeniedError(absl::StrCat(
      "worker \"", name, "\" may not register under that name: its certificate names ", told,
      " (a worker registers as one of them, or as one followed by -SUFFIX; the coordinator's --tls_worker_names)"));
}

}  // namespace shardline::server
