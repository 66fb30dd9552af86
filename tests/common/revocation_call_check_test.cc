// RevocationCallCheck with lists and certificates from deploy/certs.sh: a
// certificate revoked after the check was made is refused at once (the
// directory is read again when it changes), naming it; the others pass; a
// list that cannot be read, or none for the CA, keeps the lists read
// before; what is no certificate is refused.
#include "common/revocation_call_check.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/client/process_test_util.h"

namespace shardline::common {
namespace {

using client::testing::RunToEnd;
using client::testing::TempDir;

class RevocationCallCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("revocation-call-check");
    for (const char* name : {"a", "b"}) ASSERT_TRUE(Certs({name}));
    ASSERT_TRUE(Certs({"--crl"}));
  }
  // deploy/certs.sh DIR ARGS...: true once it succeeded.
  bool Certs(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/bin/bash", std::string(SHARDLINE_SOURCE_DIR) + "/deploy/certs.sh", dir_};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string ended = RunToEnd(argv, dir_ + "/certs.log", 60);
    EXPECT_EQ(ended, "exited with status 0") << ReadFile(dir_ + "/certs.log").value_or("");
    return ended == "exited with status 0";
  }
  std::string Pem(const std::string& name) { return ReadFile(dir_ + "/" + name + ".pem").value_or(""); }
  // Past the check's once-a-second look at the directory.
  static void NextLook() { std::this_thread::sleep_for(std::chrono::milliseconds(1100)); }

  std::string dir_;
};

TEST_F(RevocationCallCheckTest, ACertificateRevokedAfterTheStartIsRefusedAndTheOthersPass) {
  RevocationCallCheck check(dir_ + "/crl", dir_ + "/ca.pem");
  EXPECT_TRUE(check.Check(Pem("a")).ok());
  EXPECT_TRUE(check.Check(Pem("b")).ok());
  ASSERT_TRUE(Certs({"--revoke", "a"}));
  NextLook();
  const absl::Status refused = check.Check(Pem("a"));
  EXPECT_TRUE(absl::IsUnauthenticated(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), kRevokedCertificate)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "(/CN=a, serial ")) << refused;
  // A chain (certificate, then CA) is judged by its first certificate.
  EXPECT_TRUE(absl::IsUnauthenticated(check.Check(Pem("a") + Pem("ca"))));
  EXPECT_TRUE(check.Check(Pem("b") + Pem("ca")).ok());
  EXPECT_TRUE(check.Check(Pem("b")).ok());
  // Rotated: the new certificate passes, the one it replaced, revoked, not.
  ASSERT_TRUE(Certs({"b"}));
  ASSERT_TRUE(Certs({"--revoke", "b.previous"}));
  NextLook();
  EXPECT_TRUE(check.Check(Pem("b")).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(check.Check(Pem("b.previous"))));
}

TEST_F(RevocationCallCheckTest, ListsThatCannotBeReadKeepTheListsReadBefore) {
  ASSERT_TRUE(Certs({"--revoke", "a"}));
  RevocationCallCheck check(dir_ + "/crl", dir_ + "/ca.pem");
  EXPECT_TRUE(absl::IsUnauthenticated(check.Check(Pem("a"))));
  std::string hashed;  // the CA's lists' hash
  for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/crl")) {
    hashed = entry.path().filename().string().substr(0, 8);
  }
  ASSERT_EQ(hashed.size(), 8u);
  std::ofstream(dir_ + "/crl/" + hashed + ".r99") << "not a list\n";
  NextLook();
  EXPECT_TRUE(absl::IsUnauthenticated(check.Check(Pem("a")))) << "a bad file forgot the revocations";
  EXPECT_TRUE(check.Check(Pem("b")).ok());
  std::filesystem::remove(dir_ + "/crl/" + hashed + ".r99");
  // Emptied (to be filled again): the CA has no list, nothing is forgotten.
  std::filesystem::rename(dir_ + "/crl", dir_ + "/crl-aside");
  std::filesystem::create_directory(dir_ + "/crl");
  NextLook();
  EXPECT_TRUE(absl::IsUnauthenticated(check.Check(Pem("a")))) << "an emptied directory forgot the revocations";
  std::filesystem::remove(dir_ + "/crl");
  std::filesystem::rename(dir_ + "/crl-aside", dir_ + "/crl");
  ASSERT_TRUE(Certs({"--revoke", "b"}));
  NextLook();
  EXPECT_TRUE(absl::IsUnauthenticated(check.Check(Pem("a"))));
  EXPECT_TRUE(absl::IsUnauthenticated(check.Check(Pem("b")))) << "lists readable again are read";
}

TEST_F(RevocationCallCheckTest, WhatIsNoCertificateIsRefused) {
  RevocationCallCheck check(dir_ + "/crl", dir_ + "/ca.pem");
  for (const std::string& junk : {std::string(), std::string("-----BEGIN CERTIFICATE-----\nAAAA\n"),
                                  std::string(2 << 20, 'x')}) {
    EXPECT_TRUE(absl::IsUnauthenticated(check.Check(junk))) << junk.substr(0, 40);
  }
  EXPECT_TRUE(check.Check(Pem("a")).ok()) << "and serves on";
}

}  // namespace
}  // namespace shardline::common
