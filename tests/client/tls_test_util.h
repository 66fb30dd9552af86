// Helpers of the TLS tests with the real daemons: certificates from
// deploy/certs.sh, the TLS flags of a daemon or shardctl, shardctl's worker
// list, and a series scraped from a daemon's /metrics.
#ifndef SHARDLINE_TESTS_CLIENT_TLS_TEST_UTIL_H_
#define SHARDLINE_TESTS_CLIENT_TLS_TEST_UTIL_H_

#include <cmath>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.pb.h"
#include "tests/client/process_cluster.h"

namespace shardline::client::testing {

// deploy/certs.sh DIR NAME: true once DIR/NAME.pem is there.
inline bool MakeCert(const std::string& dir, const std::string& name) {
  const std::string ended = RunToEnd({"/bin/bash", std::string(SHARDLINE_SOURCE_DIR) + "/deploy/certs.sh", dir, name},
                                     dir + "/certs-" + name + ".log", 60);
  EXPECT_EQ(ended, "exited with status 0") << common::ReadFile(dir + "/certs-" + name + ".log").value_or("");
  return ended == "exited with status 0";
}

inline std::vector<std::string> TlsFlags(const std::string& dir, const std::string& name, const std::string& ca = "") {
  return {"--tls_cert=" + dir + "/" + name + ".pem", "--tls_key=" + dir + "/" + name + ".key",
          "--tls_ca=" + (ca.empty() ? dir + "/ca.pem" : ca), "--tls_refresh_s=1"};
}

// The workers of `shardctl -o json get workers`.
inline std::vector<shardline::v1::WorkerStatus> Listed(const CtlRun& listed) {
  EXPECT_EQ(listed.ended, "exited with status 0") << listed.err;
  shardline::v1::ListWorkersResponse list;
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &list, lenient).ok()) << listed.out;
  return {list.workers().begin(), list.workers().end()};
}

// The value of `series` (no labels) at the /metrics of the daemon whose
// --metrics_port_file is DIR/metrics.port; NaN where it is not there.
inline double Scraped(const std::string& dir, const std::string& series) {
  const std::string port = WaitForPort(dir + "/metrics.port");
  EXPECT_FALSE(port.empty());
  EXPECT_EQ(RunToEnd({"/bin/bash", "-c",
                      "exec 3<>/dev/tcp/127.0.0.1/" + port +
                          " && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"},
                     dir + "/metrics.txt", 30),
            "exited with status 0");
  const std::string scraped = common::ReadFile(dir + "/metrics.txt").value_or("");
  const size_t at = scraped.find("\n" + series + " ");
  EXPECT_NE(at, std::string::npos) << series << " not in " << scraped;
  return at == std::string::npos ? std::nan("") : std::stod(scraped.substr(at + series.size() + 2));
}

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTS_CLIENT_TLS_TEST_UTIL_H_
