// AdminTokens: who may call the coordinator's Admin service. A file of
// bearer tokens (--admin_tokens), one per line: `ROLE NAME TOKEN`, where
// ROLE is `admin` (everything: submit, cancel, drain, export, and what a
// viewer may) or `viewer` (get, list, watch, describe, plan, trace), NAME
// says whose token it is (for the log), and TOKEN is at least 16
// characters of [A-Za-z0-9._~+/=-]; `#` starts a comment. The file is read
// again when it changes (checked at most once a second), so a token is
// added or revoked without a restart; a file that no longer parses keeps
// the tokens last read, and says why in the log. Tokens are never logged.
// Thread-safe.
#ifndef SHARDLINE_SERVER_ADMIN_TOKENS_H_
#define SHARDLINE_SERVER_ADMIN_TOKENS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::server {

enum class AdminRole { kViewer, kAdmin };

class AdminTokens {
 public:
  // INVALID_ARGUMENT (naming the line) for a malformed file, NOT_FOUND for
  // one that cannot be read.
  static absl::StatusOr<std::unique_ptr<AdminTokens>> Load(const std::string& path);

  // The caller of a call whose `authorization` metadata is `header` may act
  // as `needed`: UNAUTHENTICATED without a known "Bearer TOKEN",
  // PERMISSION_DENIED for a viewer's token on an admin call. On success,
  // the token's name (for the log).
  absl::StatusOr<std::string> Check(const std::string& header, AdminRole needed);

 private:
  struct Holder {
    AdminRole role;
    std::string name;
  };
  explicit AdminTokens(std::string path) : path_(std::move(path)) {}
  // Parses `path_` into holders_ if it changed since the last read.
  absl::Status Reload(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::map<std::string, Holder> holders_ ABSL_GUARDED_BY(mu_);  // by token
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  struct timespec mtime_ ABSL_GUARDED_BY(mu_) = {};
  off_t size_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_ADMIN_TOKENS_H_
