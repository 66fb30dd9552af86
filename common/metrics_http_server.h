// MetricsHttpServer serves a MetricsRegistry's exposition at GET /metrics
// over plain HTTP (GNU libmicrohttpd, from Debian), for Prometheus to
// scrape; every other path is 404 and other methods 405. One thread polls
// and answers; a scrape takes the registry's lock once. (civetweb, the other
// embedded server Debian has, cannot start its threads in the worker: its
// fixed 100 KiB thread stacks are smaller than the static TLS of OpenBLAS
// and cuBLAS, and pthread_create refuses them.)
#ifndef SHARDLINE_COMMON_METRICS_HTTP_SERVER_H_
#define SHARDLINE_COMMON_METRICS_HTTP_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics_registry.h"

struct MHD_Daemon;
struct MHD_Connection;

namespace shardline::common {

class MetricsHttpServer {
 public:
  // Listens on `listen` (HOST:PORT: an IPv4 or [IPv6] address or a host
  // name; port 0 picks a free one). INVALID_ARGUMENT for a malformed
  // address, UNAVAILABLE when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                                  MetricsRegistry& registry);
  // What the daemons' --metrics_listen and --metrics_port_file ask for:
  // nothing (null) when `listen` is empty; else Start, and the bound port
  // written to `port_file` when one is named.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartIfAsked(const std::string& listen,
                                                                         const std::string& port_file,
                                                                         MetricsRegistry& registry);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  explicit MetricsHttpServer(MetricsRegistry& registry) : registry_(registry) {}
  // libmicrohttpd's access handler (its MHD_AccessHandlerCallback).
  static int Handle(void* self, MHD_Connection* connection, const char* url, const char* method,
                    const char* version, const char* upload_data, size_t* upload_data_size, void** request);

  MetricsRegistry& registry_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_METRICS_HTTP_SERVER_H_
