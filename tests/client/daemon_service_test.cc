// The daemons as a service manager and a load balancer see them: with
// NOTIFY_SOCKET pointed at a datagram socket this test holds (as systemd's
// Type=notify does), each says READY=1 once it serves, WATCHDOG=1 at half
// of WATCHDOG_USEC while it runs, and STOPPING=1 on SIGTERM, after which it
// exits 0 well within 30 s; the worker's health service says NOT_SERVING
// while it is drained; and a Python gRPC client (grpcio-reflection and
// grpcio-health-checking) lists our services by reflection and finds each
// SERVING.
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/child_process.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/client/health_check.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {
namespace {

using testing::HealthStatus;
using testing::kBin;
using testing::kNotServing;
using testing::kServing;
using testing::RunToEnd;
using testing::TempDir;
using testing::WaitForPort;

// The datagram socket systemd listens on for sd_notify messages.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ::unlink(path.c_str());
    bound_ = fd_ >= 0 && path.size() < sizeof(addr.sun_path) &&
             ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }

  // The messages received until one contains `state` (returned last), or
  // `timeout` passes (then all received, without it).
  std::vector<std::string> Until(const std::string& state, absl::Duration timeout) {
    std::vector<std::string> seen;
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) continue;
      seen.emplace_back(buffer, static_cast<size_t>(n));
      if (absl::StrContains(seen.back(), state)) return seen;
    }
    return seen;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

bool HasState(const std::vector<std::string>& messages, const std::string& state) {
  for (const std::string& m : messages) {
    if (absl::StrContains(m, state)) return true;
  }
  return false;
}

// Starts `argv` under /usr/bin/env with NOTIFY_SOCKET and a 600 ms watchdog.
std::unique_ptr<ChildProcess> StartNotifying(const NotifySocket& socket, std::vector<std::string> argv,
                                             const std::string& log) {
  argv.insert(argv.begin(), {"/usr/bin/env", "NOTIFY_SOCKET=" + socket.path(), "WATCHDOG_USEC=600000"});
  auto child = ChildProcess::Start(argv, log);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(*child) : nullptr;
}

// SIGTERM: STOPPING=1 arrives and the daemon exits 0 within 30 s.
void ExpectGracefulStop(ChildProcess& daemon, NotifySocket& socket, const std::string& log) {
  const absl::Time start = absl::Now();
  std::thread stopper([&daemon] { daemon.Stop(absl::Seconds(30)); });
  const std::vector<std::string> stopping = socket.Until("STOPPING=1", absl::Seconds(30));
  stopper.join();
  EXPECT_TRUE(HasState(stopping, "STOPPING=1")) << common::ReadFile(log).value_or("");
  std::string ended;
  EXPECT_FALSE(daemon.Running(&ended));
  EXPECT_EQ(ended, "exited with status 0") << common::ReadFile(log).value_or("");
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

class DaemonServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    // Socket paths must fit sun_path (108 bytes), whatever the tests' directory.
    char sockets[] = "/tmp/sl-sock-XXXXXX";
    ASSERT_NE(::mkdtemp(sockets), nullptr) << std::strerror(errno);
    sockets_ = sockets;
  }
  void TearDown() override {
    if (!sockets_.empty()) std::filesystem::remove_all(sockets_);
  }

  // A coordinator (lease 1 s) telling `socket`; its address once serving.
  std::string StartCoordinator(NotifySocket& socket) {
    coordinator_ = StartNotifying(socket,
                                  {kBin + "/shardline-coordinator", "--listen=127.0.0.1:0", "--state_dir=" + dir_ + "/state",
                                   "--lease_ms=1000", "--port_file=" + dir_ + "/coordinator.port"},
                                  dir_ + "/coordinator.log");
    const std::string port = WaitForPort(dir_ + "/coordinator.port");
    EXPECT_FALSE(port.empty()) << common::ReadFile(dir_ + "/coordinator.log").value_or("");
    return "127.0.0.1:" + port;
  }

  std::string Ctl(const std::string& coordinator, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kBin + "/shardctl", "--coordinator=" + coordinator};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, dir_ + "/ctl.log", 30);
  }

  std::string dir_;
  std::string sockets_;  // the notify sockets' directory
  std::unique_ptr<ChildProcess> coordinator_;
};

TEST_F(DaemonServiceTest, TheCoordinatorSaysReadyKeepsTheWatchdogFedAndSaysStopping) {
  NotifySocket socket(sockets_ + "/notify.sock");
  ASSERT_TRUE(socket.bound()) << std::strerror(errno);
  const std::string address = StartCoordinator(socket);
  const std::vector<std::string> ready = socket.Until("READY=1", absl::Seconds(20));
  ASSERT_TRUE(HasState(ready, "READY=1")) << common::ReadFile(dir_ + "/coordinator.log").value_or("");
  EXPECT_TRUE(absl::StrContains(ready.back(), "STATUS=serving on port")) << ready.back();
  EXPECT_EQ(HealthStatus(address, "").value_or(-1), kServing);
  // Pings keep coming, one each 300 ms (half of WATCHDOG_USEC); a loaded
  // machine may delay one, not stop them.
  for (int ping = 0; ping < 3; ++ping) {
    EXPECT_TRUE(HasState(socket.Until("WATCHDOG=1", absl::Seconds(3)), "WATCHDOG=1")) << "ping " << ping;
  }
  ExpectGracefulStop(*coordinator_, socket, dir_ + "/coordinator.log");
}

TEST_F(DaemonServiceTest, AWorkerIsReadyOnceRegisteredNotServingWhileDrainedAndLeavesOnSigterm) {
  NotifySocket coordinator_socket(sockets_ + "/coordinator.sock");
  NotifySocket socket(sockets_ + "/worker.sock");
  ASSERT_TRUE(socket.bound() && coordinator_socket.bound()) << std::strerror(errno);
  const std::string address = StartCoordinator(coordinator_socket);
  auto worker = StartNotifying(socket,
                               {kBin + "/shardline-worker", "--coordinator=" + address, "--name=w0", "--threads=1",
                                "--listen=127.0.0.1:0", "--port_file=" + dir_ + "/w0.port"},
                               dir_ + "/w0.log");
  ASSERT_NE(worker, nullptr);
  const std::vector<std::string> ready = socket.Until("READY=1", absl::Seconds(30));
  ASSERT_TRUE(HasState(ready, "READY=1")) << common::ReadFile(dir_ + "/w0.log").value_or("");
  EXPECT_TRUE(absl::StrContains(ready.back(), "STATUS=worker w0 registered as ")) << ready.back();
  const std::string worker_address = "127.0.0.1:" + WaitForPort(dir_ + "/w0.port");
  EXPECT_EQ(HealthStatus(worker_address, "").value_or(-1), kServing);
  EXPECT_TRUE(HasState(socket.Until("WATCHDOG=1", absl::Seconds(3)), "WATCHDOG=1"));

  // Drained: the next heartbeat (every lease / 4) tells it.
  ASSERT_EQ(Ctl(address, {"drain", "w0"}), "exited with status 0");
  int status = kServing;
  for (int i = 0; i < 100 && status == kServing; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    status = HealthStatus(worker_address, "").value_or(-1);
  }
  EXPECT_EQ(status, kNotServing) << "still serving 5 s after the drain";
  // Every service of the worker, not only the server as a whole.
  EXPECT_EQ(HealthStatus(worker_address, "shardline.v1.WorkerState").value_or(-1), kNotServing);
  ASSERT_EQ(Ctl(address, {"undrain", "w0"}), "exited with status 0");
  for (int i = 0; i < 100 && status != kServing; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    status = HealthStatus(worker_address, "").value_or(-1);
  }
  EXPECT_EQ(status, kServing) << "not serving 5 s after the undrain";

  ExpectGracefulStop(*worker, socket, dir_ + "/w0.log");
  // It told the coordinator it left: lost at once, not a lease later.
  EXPECT_TRUE(absl::StrContains(common::ReadFile(dir_ + "/coordinator.log").value_or(""), "w0"));
}

TEST_F(DaemonServiceTest, APythonClientListsOurServicesByReflectionAndFindsThemServing) {
  NotifySocket socket(sockets_ + "/notify.sock");
  const std::string address = StartCoordinator(socket);
  auto worker = ChildProcess::Start({kBin + "/shardline-worker", "--coordinator=" + address, "--name=w0",
                                     "--threads=1", "--listen=127.0.0.1:0", "--port_file=" + dir_ + "/w0.port"},
                                    dir_ + "/w0.log");
  ASSERT_TRUE(worker.ok());
  const std::string worker_address = "127.0.0.1:" + WaitForPort(dir_ + "/w0.port");
  const std::string script = std::string(SHARDLINE_SOURCE_DIR) + "/tests/tools/check_grpc_services.py";
  const std::string log = dir_ + "/python.log";
  EXPECT_EQ(RunToEnd({SHARDLINE_PYTHON, script, address, "shardline.v1.Coordinator,shardline.v1.Admin"}, log, 60),
            "exited with status 0")
      << common::ReadFile(log).value_or("");
  // StageLink is served through gRPC's generic API: described, not listed.
  EXPECT_EQ(RunToEnd({SHARDLINE_PYTHON, script, worker_address, "shardline.v1.WorkerState", "shardline.v1.StageLink"},
                     log, 60),
            "exited with status 0")
      << common::ReadFile(log).value_or("");
}

}  // namespace
}  // namespace shardline::client
