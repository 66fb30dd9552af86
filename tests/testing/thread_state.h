// What the kernel says a thread of this process is doing: how a test knows,
// without sleeping, that a thread has blocked (in a mutex, a condition, a
// join) rather than only that some time has passed. Linux only.
#ifndef SHARDLINE_TESTS_TESTING_THREAD_STATE_H_
#define SHARDLINE_TESTS_TESTING_THREAD_STATE_H_

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardline::testing {

inline pid_t CurrentThreadId() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// The state letter of thread `tid` of this process (R running, S sleeping,
// D in the kernel, ...); '?' once the thread has exited.
inline char ThreadState(pid_t tid) {
  std::ifstream stat(absl::StrCat("/proc/self/task/", tid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return '?';
  // "tid (comm) S ...": the name may hold spaces and parentheses; the state
  // follows the last ')'.
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

// Waits until thread `*tid` (0 until the thread has stored its id) sleeps or
// has exited, or `done` is set; false after `timeout`. A thread that has
// nothing to block on never sleeps, so "it blocked" is established by an
// event, not by how long it took.
inline bool AwaitThreadBlockedOrDone(const std::atomic<pid_t>& tid, const std::atomic<bool>& done,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done) return true;
    const pid_t id = tid.load();
    if (id != 0) {
      const char state = ThreadState(id);
      if (state == 'S' || state == '?') return true;
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  return false;
}

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_THREAD_STATE_H_
