// Revoked certificates with the real daemons (separate processes on
// loopback), certificates and revocation lists from deploy/certs.sh: where
// a daemon is given the lists, a revoked certificate is refused in the
// handshake, and on connections opened before it was revoked.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/client/process_cluster.h"
#include "tests/client/tls_test_util.h"

namespace shardline::client::testing {
namespace {

TEST(TlsRevocationTest, RevokedCertificatesAreRefusedInTheHandshake) {
  const std::string ca = TempDir("tls-crl");
  for (const char* name : {"coordinator", "shardctl", "gone", "later"}) ASSERT_TRUE(MakeCert(ca, name));
  auto certs = [&](const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {"/bin/bash", std::string(SHARDLINE_SOURCE_DIR) + "/deploy/certs.sh", ca};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, ca + "/" + log + ".log", 60);
  };
  ASSERT_EQ(certs({"--revoke", "gone"}, "revoke-gone"), "exited with status 0")
      << common::ReadFile(ca + "/revoke-gone.log").value_or("");
  const std::string crl = "--tls_crl_dir=" + ca + "/crl";
  std::vector<std::string> argv = {kBin + "/shardline-coordinator", "--listen=127.0.0.1:0",
                                   "--state_dir=" + ca + "/state", "--port_file=" + ca + "/coordinator.port", crl,
                                   "--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + ca + "/metrics.port"};
  for (const std::string& flag : TlsFlags(ca, "coordinator")) argv.push_back(flag);
  auto coordinator = ChildProcess::Start(argv, ca + "/coordinator.log");
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string port = WaitForPort(ca + "/coordinator.port");
  ASSERT_FALSE(port.empty()) << common::ReadFile(ca + "/coordinator.log").value_or("");
  EXPECT_NE(common::ReadFile(ca + "/coordinator.log").value_or("").find("revocation lists in " + ca + "/crl"),
            std::string::npos);
  // The lists' next update for an alert before they expire: certs.sh's 30 days.
  const double next_update = Scraped(ca, "shardline_tls_crl_next_update_timestamp_seconds");
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_GT(next_update, now + 29 * 86400.0);
  EXPECT_LT(next_update, now + 31 * 86400.0);
  auto ctl = [&](const std::string& name, bool with_crl) {
    std::vector<std::string> args = TlsFlags(ca, name);
    if (with_crl) args.push_back(crl);
    args.insert(args.end(), {"get", "workers"});
    return RunShardctl(args, "127.0.0.1:" + port, ca);
  };
  EXPECT_EQ(ctl("shardctl", true).ended, "exited with status 0") << ctl("shardctl", true).err;
  const CtlRun revoked = ctl("gone", false);
  EXPECT_NE(revoked.ended, "exited with status 0") << "a revoked certificate was served";
  EXPECT_NE(revoked.err.find("UNAVAILABLE"), std::string::npos) << revoked.err;
  EXPECT_EQ(ctl("shardctl", false).ended, "exited with status 0") << "the coordinator serves on";
  // Revoked while the coordinator runs: the next handshake reads the new list.
  EXPECT_EQ(ctl("later", false).ended, "exited with status 0");
  ASSERT_EQ(certs({"--revoke", "later"}, "revoke-later"), "exited with status 0");
  const CtlRun later = ctl("later", false);
  EXPECT_NE(later.ended, "exited with status 0") << "a certificate revoked while the coordinator ran was served";
  EXPECT_NE(later.err.find("UNAVAILABLE"), std::string::npos) << later.err;
  // The coordinator's own certificate revoked: a client with the list
  // refuses it, one without it (no list to check) does not.
  ASSERT_EQ(certs({"--revoke", "coordinator"}, "revoke-coordinator"), "exited with status 0");
  const CtlRun refused = ctl("shardctl", true);
  EXPECT_NE(refused.ended, "exited with status 0") << "a client with the list served by a revoked server";
  EXPECT_EQ(ctl("shardctl", false).ended, "exited with status 0");
  // A directory that would refuse every peer stops a daemon before it
  // serves: missing, holding no list of the CA, a file that is no list, or
  // the CA's newest list expired.
  auto start = [&](const std::string& dir, const std::string& log) {
    const std::string ended =
        RunToEnd({kBin + "/shardline-coordinator", "--listen=127.0.0.1:0", "--state_dir=" + ca + "/state-" + log,
                  "--tls_cert=" + ca + "/coordinator.pem", "--tls_key=" + ca + "/coordinator.key",
                  "--tls_ca=" + ca + "/ca.pem", "--tls_crl_dir=" + dir},
                 ca + "/" + log + ".out", 30, ca + "/" + log + ".err");
    return std::make_pair(ended, common::ReadFile(ca + "/" + log + ".err").value_or(""));
  };
  std::string hashed;  // the CA's list's file name, HASH.r0
  for (const auto& entry : std::filesystem::directory_iterator(ca + "/crl")) {
    if (absl::EndsWith(entry.path().filename().string(), ".r0")) hashed = entry.path().filename().string();
  }
  ASSERT_FALSE(hashed.empty());
  for (const char* d : {"/empty", "/junk", "/expired"}) std::filesystem::create_directory(ca + d);
  std::ofstream(ca + "/junk/" + hashed) << "not a list\n";
  ASSERT_EQ(RunToEnd({"/usr/bin/openssl", "ca", "-config", ca + "/ca-crl.cnf", "-gencrl", "-crlsec", "1", "-out",
                      ca + "/expired/" + hashed},
                     ca + "/expired.log", 30),
            "exited with status 0");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {ca + "/nothere", "is not a directory"},
      {ca + "/empty", "holds no revocation list of CA /CN=Shardline development CA"},
      {ca + "/junk", "is not a PEM certificate revocation list"},
      {ca + "/expired", "expired at"}};
  for (const auto& [dir, why] : refusals) {
    const auto [ended, err] = start(dir, std::filesystem::path(dir).filename().string());
    EXPECT_EQ(ended, "exited with status 3") << dir << ": " << err;
    EXPECT_NE(err.find(why), std::string::npos) << dir << ": " << err;
  }
  const std::string plain = RunToEnd({kBin + "/shardline-coordinator", "--listen=127.0.0.1:0",
                                      "--state_dir=" + ca + "/state3", crl},
                                     ca + "/plain.out", 30, ca + "/plain.err");
  EXPECT_EQ(plain, "exited with status 3");
  EXPECT_NE(common::ReadFile(ca + "/plain.err").value_or("").find("--tls_crl_dir needs"), std::string::npos);
}

// A connection opened before a revocation is not checked in a handshake
// again: the coordinator checks every call's certificate against its lists
// too. A worker's certificate rotated, then the old one revoked: its open
// connections are refused, it connects again with the new certificate and
// keeps its registration. Its current certificate revoked: refused on the
// open connections and in the handshake, it is lost when its lease lapses,
// and registers again once it has a new certificate.
TEST(TlsRevocationTest, RevokedCertificatesAreRefusedOnConnectionsOpenedBefore) {
  const std::string ca = TempDir("tls-crl-open");
  for (const char* name : {"coordinator", "shardctl", "w0"}) ASSERT_TRUE(MakeCert(ca, name));
  auto certs = [&](const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {"/bin/bash", std::string(SHARDLINE_SOURCE_DIR) + "/deploy/certs.sh", ca};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string ended = RunToEnd(argv, ca + "/" + log + ".log", 60);
    EXPECT_EQ(ended, "exited with status 0") << common::ReadFile(ca + "/" + log + ".log").value_or("");
    return ended == "exited with status 0";
  };
  ASSERT_TRUE(certs({"--crl"}, "crl"));
  const std::string crl = "--tls_crl_dir=" + ca + "/crl";
  std::vector<std::string> argv = {kBin + "/shardline-coordinator", "--listen=127.0.0.1:0", "--lease_ms=6000",
                                   "--state_dir=" + ca + "/state", "--port_file=" + ca + "/coordinator.port", crl,
                                   "--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + ca + "/metrics.port"};
  for (const std::string& flag : TlsFlags(ca, "coordinator")) argv.push_back(flag);
  auto coordinator = ChildProcess::Start(argv, ca + "/coordinator.log");
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = "127.0.0.1:" + WaitForPort(ca + "/coordinator.port");
  ASSERT_NE(address, "127.0.0.1:") << common::ReadFile(ca + "/coordinator.log").value_or("");
  std::vector<std::string> worker_argv = {kBin + "/shardline-worker", "--coordinator=" + address, "--name=w0",
                                          "--threads=1", "--listen=127.0.0.1:0", "--gemm_flops=1e9",
                                          "--port_file=" + ca + "/w0.port", crl};
  for (const std::string& flag : TlsFlags(ca, "w0")) worker_argv.push_back(flag);
  auto worker = ChildProcess::Start(worker_argv, ca + "/w0.log");
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_FALSE(WaitForPort(ca + "/w0.port").empty()) << common::ReadFile(ca + "/w0.log").value_or("");
  auto workers = [&] {  // "NAME ID STATE" of each registered worker
    std::vector<std::string> args = TlsFlags(ca, "shardctl");
    args.insert(args.end(), {crl, "-o", "json", "get", "workers"});
    std::set<std::string> out;
    for (const shardline::v1::WorkerStatus& w : Listed(RunShardctl(args, address, ca))) {
      out.insert(w.name() + " " + w.worker_id() + " " + w.state());
    }
    return out;
  };
  auto wait_for = [](const std::function<bool()>& done, absl::Duration limit) {
    for (const absl::Time until = absl::Now() + limit; absl::Now() < until;) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return done();
  };
  auto logged = [](const std::string& path, const std::string& line, int times = 1) {
    const std::string log = common::ReadFile(path).value_or("");
    int seen = 0;
    for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++seen;
    return seen >= times;
  };
  const std::set<std::string> registered = workers();
  ASSERT_EQ(registered.size(), 1u);
  ASSERT_TRUE(absl::EndsWith(*registered.begin(), " idle")) << *registered.begin();
  const std::string id = registered.begin()->substr(0, registered.begin()->rfind(' '));
  const std::string refused_on_open = "refusing the calls of a peer on a connection opened before its certificate";
  EXPECT_EQ(Scraped(ca, "shardline_tls_revoked_calls_total"), 0);
  const std::string worker_refused = "the coordinator refuses this worker's certificate";

  // Rotated, then the old certificate revoked.
  ASSERT_TRUE(MakeCert(ca, "w0"));
  ASSERT_TRUE(std::filesystem::exists(ca + "/w0.previous.pem"));
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // --tls_refresh_s=1
  ASSERT_TRUE(certs({"--revoke", "w0.previous"}, "revoke-previous"));
  EXPECT_TRUE(wait_for([&] { return logged(ca + "/w0.log", worker_refused); }, absl::Seconds(20)))
      << "the worker's open connection was not refused";
  EXPECT_TRUE(logged(ca + "/coordinator.log", refused_on_open));
  EXPECT_GE(Scraped(ca, "shardline_tls_revoked_calls_total"), 1);
  EXPECT_TRUE(wait_for([&] { return logged(ca + "/w0.log", "heartbeats again"); }, absl::Seconds(20)))
      << common::ReadFile(ca + "/w0.log").value_or("");
  EXPECT_EQ(workers(), registered) << "the worker kept its registration on a new connection";

  // The current certificate revoked: lost, then back with a new one.
  ASSERT_TRUE(certs({"--revoke", "w0"}, "revoke-current"));
  EXPECT_TRUE(wait_for([&] { return logged(ca + "/w0.log", worker_refused, 2); }, absl::Seconds(20)));
  EXPECT_TRUE(wait_for([&] { return workers() == std::set<std::string>{id + " lost"}; }, absl::Seconds(30)))
      << "a worker with a revoked certificate kept its lease";
  ASSERT_TRUE(MakeCert(ca, "w0"));
  auto back = [&] {  // w0 under a new registration
    for (const std::string& w : workers()) {
      if (absl::StartsWith(w, "w0 ") && absl::EndsWith(w, " idle") && w != *registered.begin()) return true;
    }
    return false;
  };
  EXPECT_TRUE(wait_for(back, absl::Seconds(60))) << common::ReadFile(ca + "/w0.log").value_or("");
}

}  // namespace
}  // namespace shardline::client::testing
