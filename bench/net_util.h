// Socket and network-namespace helpers of the benchmarks that run a peer
// in another network namespace (bench_transport's receiver, bench_collective's
// ranks across a veth testbed).
#ifndef SHARDLINE_BENCH_NET_UTIL_H_
#define SHARDLINE_BENCH_NET_UTIL_H_

#include <netinet/in.h>
#include <sys/types.h>

#include <string>

namespace shardline::bench {

// An IPv4 socket address; false if `ip` is not one.
bool Ipv4(const std::string& ip, int port, sockaddr_in* addr);
// A listening TCP socket on `ip` (port chosen by the kernel), or -1.
int ListenTcp(const std::string& ip, int* port);
// A TCP connection to ip:port with TCP_NODELAY, or -1.
int ConnectTcp(const std::string& ip, int port);
// Moves the calling thread (call it before any other thread starts) into
// network namespace /var/run/netns/`name`; false, with a message, if not.
bool EnterNetns(const std::string& name);
// Waits up to 5 s for forked `child` to exit on its own (its link closed),
// then kills it, so no benchmark leaves a peer behind.
void ReapChild(pid_t child);

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_NET_UTIL_H_
