#include "server/admin_tokens.h"

#include <sys/stat.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/random_token.h"
#include "glog/logging.h"

namespace shardline::server {
namespace {

constexpr size_t kMaxFileBytes = 1 << 20;
constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 256;

bool TokenCharacters(absl::string_view token) {
  for (char c : token) {
    const bool ok = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '~' ||
                    c == '+' || c == '/' || c == '=' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AdminTokens>> AdminTokens::Load(const std::string& path) {
  std::unique_ptr<AdminTokens> tokens(new AdminTokens(path));
  absl::MutexLock lock(&tokens->mu_);
  if (absl::Status s = tokens->Reload(/*force=*/true); !s.ok()) return s;
  return tokens;
}

absl::Status AdminTokens::Reload(bool force) {
  const absl::Time now = absl::Now();
  if (!force && now - checked_ < absl::Seconds(1)) return absl::OkStatus();
  checked_ = now;
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat("--admin_tokens: cannot read ", path_));
  if (!force && st.st_mtim.tv_sec == mtime_.tv_sec && st.st_mtim.tv_nsec == mtime_.tv_nsec && st.st_size == size_) {
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> text = common::ReadFileBounded(path_, kMaxFileBytes);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("--admin_tokens: ", text.status().message()));
  std::map<std::string, Holder> holders;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("--admin_tokens ", path_, " line ", line_number, ": ", why));
    };
    if (fields.size() != 3) return bad("expected ROLE NAME TOKEN");
    Holder holder;
    if (fields[0] == "admin") {
      holder.role = AdminRole::kAdmin;
    } else if (fields[0] == "viewer") {
      holder.role = AdminRole::kViewer;
    } else {
      return bad("the role must be admin or viewer");
    }
    holder.name = std::string(fields[1].substr(0, 64));
    const absl::string_view token = fields[2];
    if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes || !TokenCharacters(token)) {
      return bad(absl::StrCat("a token is ", kMinTokenBytes, " to ", kMaxTokenBytes,
                              " characters of [A-Za-z0-9._~+/=-] (openssl rand -hex 32 makes one)"));
    }
    if (!holders.emplace(std::string(token), holder).second) return bad("a token given twice");
  }
  holders_ = std::move(holders);
  mtime_ = st.st_mtim;
  size_ = st.st_size;
  LOG(INFO) << "admin tokens: " << holders_.size() << " read from " << path_;
  return absl::OkStatus();
}

absl::StatusOr<std::string> AdminTokens::Check(const std::string& header, AdminRole needed) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Reload(/*force=*/false); !s.ok()) {
    LOG_EVERY_N(WARNING, 1000) << s.message() << "; the tokens read before stay";
  }
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(header, kBearer)) {
    return absl::UnauthenticatedError("the Admin service needs a bearer token (shardctl --token_file)");
  }
  const absl::string_view token = absl::string_view(header).substr(kBearer.size());
  // Compared with every known token in constant time each, so that timing
  // says nothing about how close a guess came.
  const Holder* found = nullptr;
  for (const auto& [known, holder] : holders_) {
    if (common::TokensEqual(known, token)) found = &holder;
  }
  if (found == nullptr) return absl::UnauthenticatedError("the bearer token is not one the coordinator knows");
  if (needed == AdminRole::kAdmin && found->role != AdminRole::kAdmin) {
    return absl::PermissionDeniedError(absl::StrCat("the token of ", found->name,
                                                    " is a viewer's; this call needs an admin's"));
  }
  return found->name;
}

}  // namespace shardline::server
