#include "common/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace shardline::common {
namespace {

constexpr size_t kMaxHeaderBytes = 100 << 20;
constexpr absl::string_view kMetadataKey = "__metadata__";

absl::string_view SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
  }
  return "?";
}

absl::StatusOr<DType> ParseSafetensorsDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    if (name == SafetensorsDType(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported safetensors dtype '", name, "'"));
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      absl::StrAppend(&out, "\\u00", c < 0x10 ? "0" : "", absl::Hex(c));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", message));
}

// A JSON number that must be a non-negative integer.
absl::StatusOr<uint64_t> Index(const google::protobuf::Value& v, absl::string_view what) {
  if (v.kind_case() != google::protobuf::Value::kNumberValue || v.number_value() < 0 ||
      v.number_value() > 9.0e15 || std::floor(v.number_value()) != v.number_value()) {
    return Invalid(absl::StrCat(what, " is not a non-negative integer"));
  }
  return static_cast<uint64_t>(v.number_value());
}

}  // namespace

absl::StatusOr<std::string> SafetensorsHeader(const std::map<std::string, SafetensorsEntry>& entries,
                                              const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    absl::StrAppend(&header, JsonString(kMetadataKey), ":{");
    for (const auto& [key, value] : metadata) {
      absl::StrAppend(&header, first ? "" : ",", JsonString(key), ":", JsonString(value));
      first = false;
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& [name, entry] : entries) {
    if (name.empty() || name == kMetadataKey) return Invalid(absl::StrCat("bad tensor name '", name, "'"));
    ASSIGN_OR_RETURN(const size_t bytes, ByteSize(entry.dtype, entry.shape));
    std::string shape;
    for (size_t i = 0; i < entry.shape.size(); ++i) absl::StrAppend(&shape, i ? "," : "", entry.shape[i]);
    absl::StrAppend(&header, first ? "" : ",", JsonString(name), ":{\"dtype\":\"", SafetensorsDType(entry.dtype),
                    "\",\"shape\":[", shape, "],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
    first = false;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header;
}

absl::StatusOr<std::string> SafetensorsHeader(const SafetensorsContents& contents) {
  std::map<std::string, SafetensorsEntry> entries;
  for (const auto& [name, tensor] : contents.tensors) {
    SafetensorsEntry& e = entries[name];
    e.dtype = tensor.dtype();
    for (size_t i = 0; i < tensor.rank(); ++i) e.shape.push_back(tensor.dim(i));
  }
  return SafetensorsHeader(entries, contents.metadata);
}

absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsContents& contents) {
  ASSIGN_OR_RETURN(std::string out, SafetensorsHeader(contents));
  size_t data = 0;
  for (const auto& [name, tensor] : contents.tensors) data += tensor.byte_size();
  out.reserve(out.size() + data);
  for (const auto& [name, tensor] : contents.tensors) {
    out.append(static_cast<const char*>(tensor.raw_data()), tensor.byte_size());
  }
  return out;
}

absl::StatusOr<uint64_t> SafetensorsHeaderSize(absl::string_view head, uint64_t file_size) {
  if (head.size() < 8 || file_size < 8) return Invalid("file shorter than its 8-byte header length");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t{static_cast<unsigned char>(head[i])} << (8 * i);
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    return Invalid(absl::StrCat("header length ", header_size, " does not fit the file of ", file_size,
                                " bytes"));
  }
  return header_size;
}

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view head, uint64_t file_size) {
  ASSIGN_OR_RETURN(const uint64_t header_size, SafetensorsHeaderSize(head, file_size));
  if (head.size() < 8 + header_size) return Invalid("the header is cut short");
  google::protobuf::Struct header;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      std::string(head.substr(8, header_size)), &header);
  if (!parsed.ok()) return Invalid(absl::StrCat("header is not JSON: ", parsed.message().as_string()));
  SafetensorsIndex index;
  index.data_offset = 8 + header_size;
  const uint64_t data_size = file_size - index.data_offset;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, value] : header.fields()) {
    if (name == kMetadataKey) {
      if (value.kind_case() != google::protobuf::Value::kStructValue) return Invalid("__metadata__ is not an object");
      for (const auto& [key, entry] : value.struct_value().fields()) {
        if (entry.kind_case() != google::protobuf::Value::kStringValue) {
          return Invalid(absl::StrCat("__metadata__.", key, " is not a string"));
        }
        index.metadata[key] = entry.string_value();
      }
      continue;
    }
    // SerializeSafetensors refuses it too: what is read can be written again.
    if (name.empty()) return Invalid("a tensor has an empty name");
    if (value.kind_case() != google::protobuf::Value::kStructValue) {
      return Invalid(absl::StrCat("entry '", name, "' is not an object"));
    }
    const auto& fields = value.struct_value().fields();
    auto dtype_it = fields.find("dtype"), shape_it = fields.find("shape"),
         offsets_it = fields.find("data_offsets");
    if (dtype_it == fields.end() || shape_it == fields.end() || offsets_it == fields.end() ||
        shape_it->second.kind_case() != google::protobuf::Value::kListValue ||
        offsets_it->second.kind_case() != google::protobuf::Value::kListValue ||
        offsets_it->second.list_value().values_size() != 2) {
      return Invalid(absl::StrCat("entry '", name, "' needs dtype, shape and data_offsets [begin, end]"));
    }
    SafetensorsEntry entry;
    ASSIGN_OR_RETURN(entry.dtype, ParseSafetensorsDType(dtype_it->second.string_value()));
    for (const auto& dim : shape_it->second.list_value().values()) {
      ASSIGN_OR_RETURN(uint64_t d, Index(dim, absl::StrCat(name, " shape entry")));
      entry.shape.push_back(static_cast<int64_t>(d));
    }
    ASSIGN_OR_RETURN(entry.begin, Index(offsets_it->second.list_value().values(0), name));
    ASSIGN_OR_RETURN(entry.end, Index(offsets_it->second.list_value().values(1), name));
    absl::StatusOr<size_t> size = ByteSize(entry.dtype, entry.shape);
    if (!size.ok()) return Invalid(absl::StrCat(name, ": ", size.status().message()));
    if (entry.begin > entry.end || entry.end > data_size || entry.end - entry.begin != *size) {
      return Invalid(absl::StrCat(name, ": data_offsets [", entry.begin, ", ", entry.end, ") do not hold ",
                                  *size, " bytes inside ", data_size, " bytes of data"));
    }
    ranges.emplace_back(entry.begin, entry.end);
    index.entries.emplace(name, std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t expected = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != expected) return Invalid("tensor data overlaps or leaves a gap");
    expected = end;
  }
  if (expected != data_size) return Invalid("bytes after the last tensor");
  return index;
}

absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes) {
  ASSIGN_OR_RETURN(SafetensorsIndex index, ParseSafetensorsIndex(bytes, bytes.size()));
  SafetensorsContents contents;
  contents.metadata = std::move(index.metadata);
  for (const auto& [name, entry] : index.entries) {
    ASSIGN_OR_RETURN(Tensor tensor, Tensor::Zeros(entry.dtype, entry.shape));
    std::memcpy(tensor.raw_data(), bytes.data() + index.data_offset + entry.begin, entry.end - entry.begin);
    contents.tensors.emplace(name, std::move(tensor));
  }
  return contents;
}

absl::Status WriteSafetensors(const std::string& path, const SafetensorsContents& contents) {
  ASSIGN_OR_RETURN(std::string bytes, SerializeSafetensors(contents));
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  absl::StatusOr<SafetensorsContents> contents = ParseSafetensors(bytes);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(), absl::StrCat(path, ": ", contents.status().message()));
  }
  return contents;
}

}  // namespace shardline::common
