// Which names a worker's certificate lets it register under
// (server/certificate_names.h); the TLS handshake's side is client_tls_test's.
#include "server/certificate_names.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

TEST(CertificateNamesTest, AWorkerRegistersUnderItsCertificatesNamesOrOneWithASuffix) {
  const std::vector<std::string> names = {"gpu-host-3", "gpu-host-3.example.net", "localhost", "127.0.0.1"};
  for (const std::string ok : {"gpu-host-3", "gpu-host-3.example.net", "gpu-host-3-0", "gpu-host-3-gpu1",
                               "gpu-host-3.example.net-1"}) {
    EXPECT_TRUE(CheckWorkerName(ok, names).ok()) << ok;
  }
  for (const std::string refused : {"gpu-host-4", "gpu-host", "gpu-host-3-0-1", "gpu-host-3x", "-gpu-host-3",
                                    "xgpu-host-3", "gpu", "", "-", "gpu-host-3-"}) {
    const absl::Status s = CheckWorkerName(refused, names);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << refused;
    EXPECT_TRUE(absl::StrContains(s.message(), "gpu-host-3.example.net")) << s;
  }
  const absl::Status none = CheckWorkerName("w0", {});
  EXPECT_EQ(none.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(none.message(), "no client certificate")) << none;
}

TEST(CertificateNamesTest, ARefusalNamesAtMostEightOfTheCertificatesNames) {
  std::vector<std::string> names;
  for (int i = 0; i < 500; ++i) names.push_back("host-" + std::to_string(i) + ".example.net");
  const absl::Status s = CheckWorkerName("w0", names);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(s.message(), "host-7.example.net and 492 more")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "host-8.example.net")) << s;
  EXPECT_TRUE(CheckWorkerName("host-499.example.net-2", names).ok());
}

TEST(CertificateNamesTest, NoAuthContextHoldsNoNames) { EXPECT_TRUE(CertificateNames(nullptr).empty()); }

}  // namespace
}  // namespace shardline::server
