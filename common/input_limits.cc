#include "common/input_limits.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::common {

std::string Quote(absl::string_view value) {
  std::string out = "'";
  for (char c : value.substr(0, kMaxQuotedBytes)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    }
  }
  out.push_back('\'');
  if (value.size() > kMaxQuotedBytes) absl::StrAppend(&out, "… (", value.size(), " bytes)");
  return out;
}

absl::Status CheckLength(absl::string_view field, absl::string_view value, size_t max) {
  if (value.size() <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", value.size(), " bytes, at most ", max));
}

absl::Status CheckRequired(absl::string_view field, absl::string_view value, size_t max) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is required"));
  return CheckLength(field, value, max);
}

}  // namespace shardline::common
