#include "common/int8_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace shardline::common {

size_t Int8BlocksBytes(size_t values) {
  return values + 4 * ((values + kInt8BlockValues - 1) / kInt8BlockValues);
}

void EncodeInt8Blocks(absl::Span<const float> in, absl::Span<char> out) {
  char* dst = out.data();
  for (size_t begin = 0; begin < in.size(); begin += kInt8BlockValues) {
    const size_t n = std::min(kInt8BlockValues, in.size() - begin);
    const float* x = in.data() + begin;
    float largest = 0;
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
      finite = finite && std::isfinite(x[i]);
      largest = std::max(largest, std::fabs(x[i]));
    }
    const float scale = finite ? largest / 127 : std::numeric_limits<float>::quiet_NaN();
    std::memcpy(dst, &scale, 4);  // little-endian hosts only, as every frame (common/tensor_coding)
    dst += 4;
    const float inverse = finite && largest > 0 ? 127 / largest : 0;
    for (size_t i = 0; i < n; ++i) {
      const float q = std::nearbyint(x[i] * inverse);
      dst[i] = static_cast<char>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
    }
    dst += n;
  }
}

absl::Status DecodeInt8Blocks(absl::Span<const char> in, absl::Span<float> out) {
  if (in.size() != Int8BlocksBytes(out.size())) {
    return absl::InvalidArgumentError(absl::StrCat(in.size(), " bytes of 8-bit blocks for ", out.size(),
                                                   " values, which take ", Int8BlocksBytes(out.size())));
  }
  const char* src = in.data();
  for (size_t begin = 0; begin < out.size(); begin += kInt8BlockValues) {
    const size_t n = std::min(kInt8BlockValues, out.size() - begin);
    float scale;
    std::memcpy(&scale, src, 4);
    src += 4;
    if (scale < 0 || std::isinf(scale)) {
      return absl::InvalidArgumentError(absl::StrCat("an 8-bit block's scale is ", scale));
    }
    float* y = out.data() + begin;
    for (size_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<int8_t>(src[i])) * scale;
    src += n;
  }
  return absl::OkStatus();
}

}  // namespace shardline::common
