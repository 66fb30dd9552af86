#include "common/random_token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/escaping.h"
#include "glog/logging.h"

namespace shardline::common {

std::string RandomToken() {
  char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    // getrandom fails only before the kernel's pool is seeded at boot, or
    // on a kernel without it: no token is better than a guessable one.
    CHECK_GT(n, 0) << "getrandom failed: " << errno;
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

}  // namespace shardline::common
