#include "common/metrics_http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace shardline::common {
namespace {

absl::Status Malformed(const std::string& listen) {
  return absl::InvalidArgumentError(absl::StrCat("--metrics_listen=", listen.substr(0, 200),
                                                 " is not HOST:PORT (127.0.0.1:9400, [::1]:0, localhost:9400)"));
}

// Sends `body` with `status`; MHD_YES when queued.
MHD_Result Respond(MHD_Connection* connection, unsigned status, const std::string& body, const char* type,
                   bool head = false) {
  MHD_Response* response = MHD_create_response_from_buffer(head ? 0 : body.size(), const_cast<char*>(body.data()),
                                                           MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& listen,
                                                                             MetricsRegistry& registry) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return Malformed(listen);
  }
  std::string host = listen.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return Malformed(listen);
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int e = ::getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found); e != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_listen=", listen.substr(0, 200), ": ", gai_strerror(e)));
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  const bool v6 = found->ai_family == AF_INET6;
  ::freeaddrinfo(found);

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(registry));
  const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (v6 ? MHD_USE_IPv6 : 0);
  server->daemon_ = MHD_start_daemon(
      flags, static_cast<uint16_t>(port), nullptr, nullptr,
      reinterpret_cast<MHD_AccessHandlerCallback>(&MetricsHttpServer::Handle), server.get(), MHD_OPTION_SOCK_ADDR,
      reinterpret_cast<sockaddr*>(&address), MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_LIMIT, 64u,
      MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", std::strerror(errno)));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : port;
  return server;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::StartIfAsked(const std::string& listen,
                                                                                    const std::string& port_file,
                                                                                    MetricsRegistry& registry) {
  if (listen.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = Start(listen, registry);
  if (!server.ok() || port_file.empty()) return server;
  if (absl::Status s = WriteFileAtomically(port_file, absl::StrCat((*server)->port(), "\n")); !s.ok()) return s;
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

int MetricsHttpServer::Handle(void* self, MHD_Connection* connection, const char* url, const char* method,
                              const char* /*version*/, const char* /*upload_data*/, size_t* upload_data_size,
                              void** /*request*/) {
  constexpr char kText[] = "text/plain; charset=utf-8";
  // A body (POST) is not read: the answer comes at once.
  *upload_data_size = 0;
  if (std::strcmp(url, "/metrics") != 0) {
    return Respond(connection, MHD_HTTP_NOT_FOUND, "Not found: Shardline serves /metrics only\n", kText);
  }
  const bool head = std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (!head && std::strcmp(method, MHD_HTTP_METHOD_GET) != 0) {
    return Respond(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "Only GET /metrics\n", kText);
  }
  return Respond(connection, MHD_HTTP_OK, static_cast<MetricsHttpServer*>(self)->registry_.Exposition(),
                 "text/plain; version=0.0.4; charset=utf-8", head);
}

}  // namespace shardline::common
