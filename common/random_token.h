// RandomToken: 128 bits from the kernel's CSPRNG (getrandom), as 32 hex
// digits: worker secrets and link tokens, which a stranger must not guess.
// TokensEqual compares in time independent of where they differ.
#ifndef SHARDLINE_COMMON_RANDOM_TOKEN_H_
#define SHARDLINE_COMMON_RANDOM_TOKEN_H_

#include <string>

#include "absl/strings/string_view.h"

namespace shardline::common {

std::string RandomToken();
bool TokensEqual(absl::string_view a, absl::string_view b);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_RANDOM_TOKEN_H_
