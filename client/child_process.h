// ChildProcess starts a program (fork + exec, its own process group) and
// owns it: the destructor stops it (SIGTERM, then SIGKILL after a grace
// period) and reaps it, so a launcher never leaves daemons behind. Output
// goes to a log file (standard error to a second one, when given). Not
// thread-safe.
#ifndef SHARDLINE_CLIENT_CHILD_PROCESS_H_
#define SHARDLINE_CLIENT_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardline::client {

class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                             const std::string& log_path,
                                                             const std::string& stderr_path = "");
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  // True while it runs; once it has exited, its exit description.
  bool Running(std::string* how_it_ended = nullptr);
  // SIGTERM, wait up to `grace`, then SIGKILL; reaps it.
  void Stop(absl::Duration grace = absl::Seconds(3));

 private:
  ChildProcess(pid_t pid, std::string name) : pid_(pid), name_(std::move(name)) {}
  pid_t pid_;
  std::string name_;
  bool reaped_ = false;
  std::string ended_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_CHILD_PROCESS_H_
