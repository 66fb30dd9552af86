#include "bench/net_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace shardline::bench {

bool Ipv4(const std::string& ip, int port, sockaddr_in* addr) {
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_port = htons(static_cast<uint16_t>(port));
  return ::inet_pton(AF_INET, ip.c_str(), &addr->sin_addr) == 1;
}

int ListenTcp(const std::string& ip, int* port) {
  sockaddr_in addr;
  if (!Ipv4(ip, 0, &addr)) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("tcp listen");
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

int ConnectTcp(const std::string& ip, int port) {
  sockaddr_in addr;
  if (!Ipv4(ip, port, &addr)) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  if (fd < 0 || ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("tcp connect");
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool EnterNetns(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  const int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
    std::perror(path.c_str());
    if (ns >= 0) ::close(ns);
    return false;
  }
  ::close(ns);
  return true;
}

void ReapChild(pid_t child) {
  int status = 0;
  for (int i = 0; i < 500; ++i) {
    if (::waitpid(child, &status, WNOHANG) == child) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
}

}  // namespace shardline::bench
