// bench_export: what exporting a committed checkpoint's weights costs the
// coordinator, streamed from the shard files (WeightStore::OpenWeights, the
// path `shardctl export` and a job's init.from_job take) against read whole
// into memory and serialized (WeightStore::ExportWeights, what the export
// did before). A WeightStore of its own in a temporary directory holds one
// committed version of `--mib` MiB of weights in `--shards` shards, each
// with AdamW's two moments beside its weights (three times the weights on
// disk, as a job's checkpoint). Per path: seconds, the bytes out and the
// growth of the process's peak resident memory while it ran (VmHWM, reset
// before each path through /proc/self/clear_refs).
//
//   bench_export [--mib=256] [--shards=4] [--json=FILE]
#include <malloc.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_report.h"
#include "common/init.h"
#include "common/safetensors.h"
#include "common/shard_digest.h"
#include "server/weight_store.h"

ABSL_FLAG(int, mib, 256, "MiB of weights in the checkpoint");
ABSL_FLAG(int, shards, 4, "shards (pipeline stages) it is stored in");
ABSL_FLAG(std::string, json, "", "write the rows here as JSON");

namespace shardline::bench {
namespace {

// A field of /proc/self/status in KiB (VmRSS, VmHWM).
double StatusKib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  }
  return 0;
}

// Seconds, bytes out and peak-memory growth (MiB) of `fn`.
template <typename Fn>
void Measure(const std::string& path, Fn fn, BenchReport& report) {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
  const double rss = StatusKib("VmRSS");
  const auto start = std::chrono::steady_clock::now();
  const uint64_t bytes = fn();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.Add({{"path", path},
              {"out_mib", static_cast<double>(bytes) / (1 << 20)},
              {"seconds", seconds},
              {"peak_growth_mib", (StatusKib("VmHWM") - rss) / 1024}});
}

void Run(BenchReport& report) {
  const int shards = absl::GetFlag(FLAGS_shards);
  const int64_t floats = int64_t{absl::GetFlag(FLAGS_mib)} * (1 << 20) / 4 / shards;
  char pattern[] = "/tmp/bench-export-XXXXXX";
  CHECK(mkdtemp(pattern) != nullptr);
  const std::string root = pattern;
  {
    auto store = server::WeightStore::Open(root);
    BENCH_CHECK_OK(store.status());
    for (int s = 0; s < shards; ++s) {
      server::ShardReport r;
      r.key = {"bench", s, shards, /*step=*/10, /*epoch=*/1};
      const std::string name = absl::StrCat("blocks.", s, ".weight");
      for (const std::string& prefix : {std::string(), std::string(server::kOptimizerPrefix) + "m.",
                                       std::string(server::kOptimizerPrefix) + "v."}) {
        auto t = common::Tensor::Zeros(common::DType::kF32, {floats});
        BENCH_CHECK_OK(t.status());
        float v = static_cast<float>(s);
        for (float& x : t->values<float>()) x = (v += 0.25f);
        r.contents.tensors.emplace(prefix + name, *std::move(t));
      }
      BENCH_CHECK_OK((*store)->Report(r).status());
    }
  }
  auto store = server::WeightStore::Open(root);
  BENCH_CHECK_OK(store.status());
  Measure("streamed", [&]() -> uint64_t {
    auto file = (*store)->OpenWeights("bench", {{"format", "pt"}});
    BENCH_CHECK_OK(file.status());
    common::ShardDigest sink;  // every byte touched, as the stream's copy does
    for (uint64_t at = 0; at < (*file)->size();) {
      auto chunk = (*file)->Read(at, 1 << 20);
      BENCH_CHECK_OK(chunk.status());
      sink.Update(*chunk);
      at += chunk->size();
    }
    return sink.length();
  }, report);
  Measure("in_memory", [&]() -> uint64_t {
    auto contents = (*store)->ExportWeights("bench", {{"format", "pt"}});
    BENCH_CHECK_OK(contents.status());
    auto bytes = common::SerializeSafetensors(*contents);
    BENCH_CHECK_OK(bytes.status());
    return bytes->size();
  }, report);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "what exporting a checkpoint's weights costs the coordinator");
  shardline::bench::BenchReport report;
  shardline::bench::Run(report);
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}
