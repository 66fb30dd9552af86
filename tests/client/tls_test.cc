// Mutual TLS and bearer tokens with the real daemons (separate processes on
// loopback), certificates from deploy/certs.sh: a job runs with every
// channel (admin, coordinator, stage links) under TLS; plaintext, a
// certificate of another CA, a missing or unknown token and a viewer's
// token on an admin call are refused with UNAVAILABLE / UNAUTHENTICATED /
// PERMISSION_DENIED while the daemons keep serving; a CA added to the file
// the coordinator reads is trusted without a restart; and a daemon refuses
// to listen beyond loopback in plaintext or without tokens unless told
// --insecure; a worker registers only under a name its certificate holds.
// Revocation: tls_revocation_test.cc.
#include <chrono>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.pb.h"
#include "tests/client/process_cluster.h"
#include "tests/client/tls_test_util.h"

namespace shardline::client::testing {
namespace {

constexpr char kAdminToken[] = "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf";
constexpr char kViewerToken[] = "v0v1v2v3v4v5v6v7v8v9vavbvcvdvevf";

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(TempDir("tls-certs"));
    other_ca_ = new std::string(TempDir("tls-other-ca"));
    for (const char* name : {"coordinator", "w0", "w1", "shardctl"}) {
      if (!MakeCert(*certs_, name)) return;
    }
    if (!MakeCert(*other_ca_, "shardctl")) return;  // a stranger's CA and certificate
    // The coordinator reads its own copy of the CA bundle (the reload test
    // adds a CA to it).
    std::filesystem::copy_file(*certs_ + "/ca.pem", *certs_ + "/coordinator-ca.pem");
    std::ofstream(*certs_ + "/tokens") << "# role name token\nadmin ops " << kAdminToken << "\nviewer dash "
                                       << kViewerToken << "\n";
    ProcessCluster::Options options;
    options.coordinator_flags = TlsFlags(*certs_, "coordinator", *certs_ + "/coordinator-ca.pem");
    options.coordinator_flags.push_back("--admin_tokens=" + *certs_ + "/tokens");
    options.worker_flags = TlsFlags(*certs_, "w%W");
    cluster_ = ProcessCluster::Start("tls", options).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete certs_;
    delete other_ca_;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  // shardctl with TLS (shardctl's certificate from `dir`) and `token` (none: "").
  CtlRun Ctl(std::vector<std::string> args, const std::string& token = kAdminToken, const std::string& dir = "",
             const std::string& ca = "") {
    std::vector<std::string> argv = TlsFlags(dir.empty() ? *certs_ : dir, "shardctl", ca);
    if (!token.empty()) {
      const std::string file = absl::StrCat(cluster_->dir(), "/token-", token.substr(0, 2));
      std::ofstream(file) << token << "\n";
      argv.push_back("--token_file=" + file);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return cluster_->Ctl(argv);
  }
  bool Serving() { return Ctl({"get", "workers"}).ended == "exited with status 0"; }

  static ProcessCluster* cluster_;
  static std::string* certs_;
  static std::string* other_ca_;
};

ProcessCluster* TlsTest::cluster_ = nullptr;
std::string* TlsTest::certs_ = nullptr;
std::string* TlsTest::other_ca_ = nullptr;

TEST_F(TlsTest, AJobRunsWithEveryChannelUnderMutualTls) {
  const std::string spec = cluster_->dir() + "/job.json";
  std::ofstream(spec) << R"({"name": "tls",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 16, "n_heads": 2, "n_layers": 2},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 4, "global_batch": 4, "micro_batches": 2, "seed": 5,
              "optimizer": {"kind": "adamw", "lr": 0.003}},
    "parallel": {"pipeline_stages": 2}, "checkpoint": {"every_steps": 2}})";
  const CtlRun submitted = Ctl({"-o", "json", "submit", spec});
  ASSERT_EQ(submitted.ended, "exited with status 0") << submitted.err;
  shardline::v1::JobStatus job;
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(submitted.out, &job, lenient).ok()) << submitted.out;
  EXPECT_NE(common::ReadFile(cluster_->dir() + "/coordinator0.log")
                .value_or("")
                .find("admin: ops: submitted job " + job.job_id() + " (tls)"),
            std::string::npos);
  EXPECT_EQ(job.submitted_by(), "ops");
  const CtlRun watched = Ctl({"watch", job.job_id()}, kViewerToken);
  EXPECT_EQ(watched.ended, "exited with status 0") << watched.out << watched.err;
  EXPECT_NE(watched.out.find("SUCCEEDED"), std::string::npos) << watched.out;
}

TEST_F(TlsTest, PlaintextAndForeignCertificatesAreRefusedAndTheDaemonServesOn) {
  const CtlRun plaintext = cluster_->Ctl({"--token_file=/dev/null", "get", "workers"});
  EXPECT_NE(plaintext.ended, "exited with status 0");
  EXPECT_NE(plaintext.err.find("UNAVAILABLE"), std::string::npos) << plaintext.err;
  // A certificate of another CA (trusting ours, so the refusal is the server's).
  const CtlRun foreign = Ctl({"get", "workers"}, kAdminToken, *other_ca_, *certs_ + "/ca.pem");
  EXPECT_NE(foreign.ended, "exited with status 0");
  EXPECT_NE(foreign.err.find("UNAVAILABLE"), std::string::npos) << foreign.err;
  EXPECT_TRUE(Serving());
}

TEST_F(TlsTest, TokensAreCheckedOnEveryCallWithTheirRoles) {
  const CtlRun none = Ctl({"get", "workers"}, "");
  EXPECT_NE(none.ended, "exited with status 0");
  EXPECT_NE(none.err.find("needs a bearer token"), std::string::npos) << none.err;
  const CtlRun unknown = Ctl({"get", "workers"}, "x0x1x2x3x4x5x6x7x8x9");
  EXPECT_NE(unknown.ended, "exited with status 0");
  EXPECT_NE(unknown.err.find("not one the coordinator knows"), std::string::npos) << unknown.err;
  const CtlRun viewer_reads = Ctl({"get", "workers"}, kViewerToken);
  EXPECT_EQ(viewer_reads.ended, "exited with status 0") << viewer_reads.err;
  const CtlRun viewer_drains = Ctl({"drain", "w0"}, kViewerToken);
  EXPECT_NE(viewer_drains.ended, "exited with status 0");
  EXPECT_NE(viewer_drains.err.find("viewer's; this call needs an admin's"), std::string::npos) << viewer_drains.err;
  const CtlRun viewer_replans = Ctl({"replan", "job-1"}, kViewerToken);
  EXPECT_NE(viewer_replans.err.find("viewer's; this call needs an admin's"), std::string::npos)
      << viewer_replans.err;
  const CtlRun viewer_deletes = Ctl({"delete", "job-1"}, kViewerToken);
  EXPECT_NE(viewer_deletes.err.find("viewer's; this call needs an admin's"), std::string::npos)
      << viewer_deletes.err;
  // Weights sent with a submission: refused before a byte is kept.
  const std::string spec = cluster_->dir() + "/viewer-job.json";
  std::ofstream(spec) << R"({"name": "v",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 16, "n_heads": 2, "n_layers": 2},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 2, "global_batch": 4, "micro_batches": 2, "optimizer": {"kind": "adamw", "lr": 0.003}}})";
  const CtlRun viewer_sends = Ctl({"submit", spec, "--init_weights=" + spec}, kViewerToken);
  EXPECT_NE(viewer_sends.err.find("viewer's; this call needs an admin's"), std::string::npos) << viewer_sends.err;
  const std::string log = common::ReadFile(cluster_->dir() + "/coordinator0.log").value_or("");
  EXPECT_EQ(log.find(kAdminToken), std::string::npos) << "a token in the log";
  EXPECT_EQ(log.find(kViewerToken), std::string::npos) << "a token in the log";
  EXPECT_TRUE(Serving());
}

// What an admin call changed is logged with who asked (the token's name),
// never the token; a viewer's reads are not.
TEST_F(TlsTest, AdminCallsAreLoggedWithWhoAsked) {
  ASSERT_EQ(Ctl({"drain", "w0"}).ended, "exited with status 0");
  ASSERT_EQ(Ctl({"undrain", "w0"}).ended, "exited with status 0");
  ASSERT_EQ(Ctl({"get", "workers"}, kViewerToken).ended, "exited with status 0");
  const std::string log = common::ReadFile(cluster_->dir() + "/coordinator0.log").value_or("");
  EXPECT_NE(log.find("worker w0 drained by ops"), std::string::npos) << log;
  EXPECT_NE(log.find("admin: ops: undrained worker w0"), std::string::npos) << log;
  EXPECT_EQ(log.find("admin: dash"), std::string::npos) << "a viewer's read logged";
  EXPECT_EQ(log.find(kAdminToken), std::string::npos) << "a token in the log";
}

// --tls_refresh_s=1: a CA added to the bundle the coordinator reads is
// trusted within seconds, without a restart.
TEST_F(TlsTest, ACaAddedToTheFilesIsTrustedWithoutARestart) {
  const std::string both = cluster_->dir() + "/both-ca.pem";
  std::ofstream(both) << common::ReadFile(*certs_ + "/ca.pem").value_or("")
                      << common::ReadFile(*other_ca_ + "/ca.pem").value_or("");
  EXPECT_NE(Ctl({"get", "workers"}, kAdminToken, *other_ca_, both).ended, "exited with status 0")
      << "not trusted yet";
  const std::string bundle = *certs_ + "/coordinator-ca.pem";
  const std::string rotated = bundle + ".new";
  std::ofstream(rotated) << common::ReadFile(both).value_or("");
  std::filesystem::rename(rotated, bundle);
  bool trusted = false;
  for (int i = 0; i < 30 && !trusted; ++i) {
    trusted = Ctl({"get", "workers"}, kAdminToken, *other_ca_, both).ended == "exited with status 0";
    if (!trusted) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_TRUE(trusted) << "the new CA was not trusted within 15 s";
}

// Worker names are bound to certificates (--tls_worker_names, on under
// TLS): w0's certificate cannot register as w1 (once w1 is lost, that would
// take its place and its jobs' positions) nor as w5: the worker exits 2
// naming its certificate's names and no worker record changes. It can
// register as w0-extra.
TEST_F(TlsTest, AWorkerRegistersOnlyUnderANameItsCertificateHolds) {
  const std::string dir = cluster_->dir();
  auto worker = [&](const std::string& name) {
    std::vector<std::string> argv = {kBin + "/shardline-worker", "--coordinator=" + cluster_->address(),
                                     "--name=" + name, "--threads=1", "--listen=127.0.0.1:0", "--gemm_flops=1e9",
                                     "--port_file=" + dir + "/" + name + ".port"};
    for (const std::string& flag : TlsFlags(*certs_, "w0")) argv.push_back(flag);
    return argv;
  };
  auto workers = [&] {  // "NAME ID" of each registered worker
    std::set<std::string> out;
    for (const shardline::v1::WorkerStatus& w : Listed(Ctl({"-o", "json", "get", "workers"}))) {
      out.insert(w.name() + " " + w.worker_id());
    }
    return out;
  };
  const std::set<std::string> before = workers();
  ASSERT_EQ(before.size(), 2u);
  ASSERT_EQ(before.rbegin()->substr(0, 3), "w1 ");
  for (const std::string name : {"w1", "w5"}) {
    const std::string ended = RunToEnd(worker(name), dir + "/" + name + "-impostor.out", 30,
                                       dir + "/" + name + "-impostor.err");
    const std::string err = common::ReadFile(dir + "/" + name + "-impostor.err").value_or("");
    EXPECT_EQ(ended, "exited with status 2") << name << ": " << err;
    EXPECT_NE(err.find("may not register under that name: its certificate names w0"), std::string::npos) << err;
    EXPECT_EQ(workers(), before) << name << ": a refused registration changes no worker";
  }
  auto extra = ChildProcess::Start(worker("w0-extra"), dir + "/w0-extra.log");
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_FALSE(WaitForPort(dir + "/w0-extra.port").empty()) << common::ReadFile(dir + "/w0-extra.log").value_or("");
  const std::set<std::string> after = workers();
  EXPECT_EQ(after.size(), 3u);
  EXPECT_TRUE(std::any_of(after.begin(), after.end(), [](const std::string& w) { return w.rfind("w0-extra ", 0) == 0; }));
  EXPECT_TRUE(Serving());
}

// Revocation lists (--tls_crl_dir; deploy/certs.sh DIR --revoke NAME): a
// coordinator given one refuses a revoked client certificate in the
// handshake, also one revoked while it runs, and serves the others on; a
// client given one refuses a server whose certificate was revoked. A
// missing directory, or one without TLS, stops a daemon at start.
TEST_F(TlsTest, ADaemonRefusesToListenBeyondLoopbackWithoutTlsAndTokensUnlessInsecure) {
  const std::string dir = cluster_->dir();
  auto run = [&](const std::string& log, std::vector<std::string> argv) {
    const std::string ended = RunToEnd(argv, dir + "/" + log + ".out", 30, dir + "/" + log + ".err");
    return std::make_pair(ended, common::ReadFile(dir + "/" + log + ".err").value_or(""));
  };
  auto [plain_ended, plain_err] = run("plain", {kBin + "/shardline-coordinator", "--listen=0.0.0.0:0",
                                                "--state_dir=" + dir + "/plain-state"});
  EXPECT_EQ(plain_ended, "exited with status 3");
  EXPECT_NE(plain_err.find("in plaintext"), std::string::npos) << plain_err;
  std::vector<std::string> no_tokens = {kBin + "/shardline-coordinator", "--listen=0.0.0.0:0",
                                        "--state_dir=" + dir + "/no-tokens-state"};
  for (const std::string& flag : TlsFlags(*certs_, "coordinator")) no_tokens.push_back(flag);
  auto [tokens_ended, tokens_err] = run("no-tokens", no_tokens);
  EXPECT_EQ(tokens_ended, "exited with status 3");
  EXPECT_NE(tokens_err.find("--admin_tokens"), std::string::npos) << tokens_err;
  auto [worker_ended, worker_err] =
      run("worker", {kBin + "/shardline-worker", "--coordinator=127.0.0.1:1", "--name=x", "--listen=0.0.0.0:0",
                     "--advertise_host=127.0.0.1"});
  EXPECT_EQ(worker_ended, "exited with status 3");
  EXPECT_NE(worker_err.find("in plaintext"), std::string::npos) << worker_err;
  // --insecure: it starts (and says so), then stops on SIGTERM.
  auto insecure = ChildProcess::Start({kBin + "/shardline-coordinator", "--listen=0.0.0.0:0", "--insecure",
                                       "--state_dir=" + dir + "/insecure-state", "--port_file=" + dir + "/insecure.port"},
                                      dir + "/insecure.log");
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  EXPECT_FALSE(WaitForPort(dir + "/insecure.port").empty());
  EXPECT_NE(common::ReadFile(dir + "/insecure.log").value_or("").find("plaintext (--insecure)"), std::string::npos);
}

}  // namespace
}  // namespace shardline::client::testing
