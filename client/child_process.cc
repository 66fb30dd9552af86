#include "client/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shardline::client {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const std::vector<std::string>& argv,
                                                                  const std::string& log_path,
                                                                  const std::string& stderr_path) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to start");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot create ", log_path, ": ", std::strerror(errno)));
  const int errors =
      stderr_path.empty() ? log : ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (errors < 0) {
    ::close(log);
    return absl::InternalError(absl::StrCat("cannot create ", stderr_path, ": ", std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(errors, STDERR_FILENO);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (errors != log) ::close(errors);
  ::close(log);
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(fork_errno)));
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, argv[0]));
}

bool ChildProcess::Running(std::string* how_it_ended) {
  if (!reaped_) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      ended_ = WIFEXITED(status) ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                                 : absl::StrCat("was killed by signal ", WTERMSIG(status));
    }
  }
  if (reaped_ && how_it_ended != nullptr) *how_it_ended = ended_;
  return !reaped_;
}

void ChildProcess::Stop(absl::Duration grace) {
  if (!Running()) return;
  ::kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (Running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  if (Running()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    ended_ = "was killed after the grace period";
  }
}

ChildProcess::~ChildProcess() { Stop(); }

}  // namespace shardline::client
