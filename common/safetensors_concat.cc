#include "common/safetensors_concat.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::common {

absl::StatusOr<std::unique_ptr<SafetensorsConcat>> SafetensorsConcat::Create(
    std::vector<std::unique_ptr<SafetensorsFile>> files, const std::function<bool(const std::string&)>& keep,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsConcat> out(new SafetensorsConcat());
  out->files_ = std::move(files);
  std::map<std::string, std::pair<const SafetensorsFile*, SafetensorsEntry>> kept;
  for (const std::unique_ptr<SafetensorsFile>& file : out->files_) {
    for (const auto& [name, entry] : file->index().entries) {
      if (!keep(name)) continue;
      if (!kept.emplace(name, std::make_pair(file.get(), entry)).second) {
        return absl::DataLossError(absl::StrCat("tensor ", name, " is in more than one file"));
      }
    }
  }
  std::map<std::string, SafetensorsEntry> entries;
  for (const auto& [name, source] : kept) {
    const SafetensorsEntry& e = source.second;
    entries.emplace(name, e);
    // In name order, as the header gives their offsets.
    out->pieces_.push_back({out->data_bytes_, out->data_bytes_ + (e.end - e.begin), source.first, e.begin});
    out->data_bytes_ += e.end - e.begin;
  }
  ASSIGN_OR_RETURN(out->header_, SafetensorsHeader(entries, metadata));
  return out;
}

absl::StatusOr<std::string> SafetensorsConcat::Read(uint64_t offset, size_t max) const {
  std::string out;
  if (offset >= size()) return out;
  out.resize(static_cast<size_t>(std::min<uint64_t>(max, size() - offset)));
  size_t done = 0;
  if (offset < header_.size()) {
    done = static_cast<size_t>(std::min<uint64_t>(out.size(), header_.size() - offset));
    std::copy_n(header_.data() + offset, done, out.data());
  }
  // The first piece that ends past where the data part starts.
  uint64_t at = offset + done - header_.size();
  auto piece = std::upper_bound(pieces_.begin(), pieces_.end(), at,
                                [](uint64_t a, const Piece& p) { return a < p.end; });
  for (; done < out.size() && piece != pieces_.end(); ++piece) {
    const uint64_t from = at - piece->begin;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size() - done, piece->end - at));
    RETURN_IF_ERROR(piece->file->ReadData(piece->source_begin + from, absl::MakeSpan(out.data() + done, n)));
    done += n;
    at += n;
  }
  return out;
}

}  // namespace shardline::common
