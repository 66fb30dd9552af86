// bench_backend: GEMM and per-kernel throughput of each backend built.
// For the CPU backend the BLAS library's own cblas_sgemm, on OpenBLAS' own
// threads (as many as the backend's), runs in the same process on the same
// buffers, interleaved rep by rep with the backend call (which splits the
// GEMM over its pool, OpenBLAS single-threaded: cpu_gemm.h), so the split's
// cost or gain shows as a ratio that machine noise hits equally.
//
//   bench_backend [--devices=cpu,cuda:0] [--threads=N] [--reps=N]
//                 [--gemm_sizes=256,512,1024] [--json=FILE]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_report.h"
#include "common/init.h"
#include "glog/logging.h"
#include "worker/backend/attention.h"
#include "worker/backend/backend_factory.h"
#include "worker/backend/cpu/cpu_gemm.h"

ABSL_FLAG(std::string, devices, "", "comma-separated devices; default: cpu, plus cuda:0 if present");
ABSL_FLAG(int, threads, 0, "CPU backend threads (0 = BLAS default)");
ABSL_FLAG(int, reps, 7, "timed repetitions per measurement (median reported)");
ABSL_FLAG(std::string, gemm_sizes, "256,512,1024", "square GEMM sizes");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");

namespace shardline::bench {
namespace {

using worker::Backend;
using worker::DeviceBuffer;

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

DeviceBuffer Filled(Backend& backend, size_t n, float value) {
  DeviceBuffer buffer = std::move(backend.AllocateZeros(n)).value();
  BENCH_CHECK_OK(backend.Fill(buffer.span<float>(), value));
  return buffer;
}

void Sync(Backend& backend) { BENCH_CHECK_OK(backend.Synchronize()); }

// blas_threads: OpenBLAS' thread count for the direct calls (the backend's).
void BenchGemm(Backend& backend, int n, int blas_threads, int reps, BenchReport& report) {
  const size_t count = static_cast<size_t>(n) * n;
  DeviceBuffer a = Filled(backend, count, 0.5f), b = Filled(backend, count, 0.25f),
               c = Filled(backend, count, 0.0f);
  worker::GemmShape shape;
  shape.m = shape.n = shape.k = n;
  auto run_backend = [&] {
    BENCH_CHECK_OK(backend.Gemm(shape, a.span<float>(), b.span<float>(), c.span<float>()));
    Sync(backend);
  };
  const bool cpu = backend.name() == "cpu";
  auto run_direct = [&] {
    openblas_set_num_threads(blas_threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                static_cast<const float*>(a.data()), n, static_cast<const float*>(b.data()), n,
                0.0f, static_cast<float*>(c.data()), n);
    openblas_set_num_threads(1);  // as the backends keep it
  };
  run_backend();
  if (cpu) run_direct();
  std::vector<double> ours, direct;
  for (int i = 0; i < reps; ++i) {
    ours.push_back(Seconds(run_backend));
    if (cpu) direct.push_back(Seconds(run_direct));
  }
  const double flops = 2.0 * n * n * n;
  BenchReport::Row row = {{"device", backend.name()},
                          {"op", "gemm"},
                          {"shape", absl::StrCat(n, "x", n, "x", n)},
                          {"median_ms", Median(ours) * 1e3},
                          {"gflops", flops / Median(ours) / 1e9}};
  if (cpu) {
    row.push_back({"blas_direct_gflops", flops / Median(direct) / 1e9});
    row.push_back({"ratio_to_blas", Median(direct) / Median(ours)});
  }
  report.Add(std::move(row));
}

// Times one kernel and reports nominal memory traffic (bytes) or FLOPs.
void AddOp(Backend& backend, int reps, BenchReport& report, const std::string& op,
           const std::string& shape, double bytes, double flops, const std::function<void()>& fn) {
  const double seconds = MedianSeconds(reps, [&] {
    fn();
    Sync(backend);
  });
  BenchReport::Row row = {{"device", backend.name()},
                          {"op", op},
                          {"shape", shape},
                          {"median_ms", seconds * 1e3}};
  if (flops > 0) row.push_back({"gflops", flops / seconds / 1e9});
  if (bytes > 0) row.push_back({"gb_per_s", bytes / seconds / 1e9});
  report.Add(std::move(row));
}

// The kernels of one GPT training step at a small-model shape: 8 sequences
// of 128 tokens, width 512, 8 heads, byte vocabulary.
void BenchKernels(Backend& backend, int reps, BenchReport& report) {
  constexpr int64_t kBatch = 8, kT = 128, kC = 512, kHeads = 8, kVocab = 256;
  constexpr int64_t kRows = kBatch * kT, kN = kRows * kC;
  const std::string act = absl::StrCat(kRows, "x", kC);
  DeviceBuffer x = Filled(backend, kN * 4, 0.1f), y = Filled(backend, kN * 4, 0.0f),
               dy = Filled(backend, kN * 4, 0.01f), dx = Filled(backend, kN * 4, 0.0f);
  DeviceBuffer gamma = Filled(backend, kC, 1.0f), beta = Filled(backend, kC, 0.0f),
               stats = Filled(backend, 2 * kRows, 0.0f);
  auto f = [](const DeviceBuffer& b) { return b.span<float>(); };
  const double n4 = static_cast<double>(kN) * 4 * sizeof(float);  // MLP hidden is 4C wide
  AddOp(backend, reps, report, "gelu_forward", absl::StrCat(kRows, "x", 4 * kC), 2 * n4, 0,
        [&] { BENCH_CHECK_OK(backend.GeluForward(f(x), f(y))); });
  AddOp(backend, reps, report, "gelu_backward", absl::StrCat(kRows, "x", 4 * kC), 4 * n4, 0,
        [&] { BENCH_CHECK_OK(backend.GeluBackward(f(x), f(dy), f(dx))); });
  const worker::LayerNormShape ln{kRows, kC, 1e-5f};
  auto mean = f(stats).subspan(0, kRows), rstd = f(stats).subspan(kRows, kRows);
  AddOp(backend, reps, report, "layernorm_forward", act, 2.0 * kN * 4, 0, [&] {
    BENCH_CHECK_OK(backend.LayerNormForward(ln, f(x), f(gamma), f(beta), f(y), mean, rstd));
  });
  AddOp(backend, reps, report, "layernorm_backward", act, 4.0 * kN * 4, 0, [&] {
    BENCH_CHECK_OK(backend.LayerNormBackward(ln, f(x), f(gamma), mean, rstd, f(dy), f(dx), f(gamma),
                                       f(beta)));
  });

  const worker::AttentionShape attn{kBatch, kT, kHeads, kC / kHeads};
  const int64_t probs_n = kBatch * kHeads * kT * kT;
  DeviceBuffer probs = Filled(backend, probs_n, 0.0f), scratch = Filled(backend, probs_n, 0.0f);
  const std::string attn_shape = absl::StrCat("B", kBatch, " T", kT, " H", kHeads, " d", kC / kHeads);
  const worker::SoftmaxShape softmax{kBatch * kHeads, kT, 0.125f};
  AddOp(backend, reps, report, "causal_softmax_forward", attn_shape, 2.0 * probs_n * 4, 0, [&] {
    BENCH_CHECK_OK(backend.CausalSoftmaxForward(softmax, f(scratch), f(probs)));
  });
  // The backend's attention (the CPU's tiled kernel) and the composed one, at
  // the large model's length and at a long one (the same tokens per call),
  // where the CPU kernel keeps a log-sum-exp per query instead of the weights.
  for (const worker::AttentionShape& a : {attn, worker::AttentionShape{1, 8 * kT, kHeads, kC / kHeads}}) {
    const double flops = 2.0 * 2 * a.batch * a.heads * a.t * a.t * a.head_dim;  // the full t² products
    const std::string shape = absl::StrCat("B", a.batch, " T", a.t, " H", a.heads, " d", a.head_dim);
    const int64_t weights = a.batch * a.heads * a.t * a.t;
    DeviceBuffer saved = Filled(backend, weights, 0.0f), attn_scratch = Filled(backend, weights, 0.0f);
    for (bool composed : {false, true}) {
      if (composed && !backend.has_attention_kernel()) continue;  // it is what the backend runs
      const std::string suffix = composed ? "_composed" : "";
      AddOp(backend, reps, report, "attention_forward" + suffix, shape, 0, flops, [&] {
        BENCH_CHECK_OK(composed ? worker::ComposedAttentionForward(backend, a, f(x), f(y), f(saved))
                                : worker::AttentionForward(backend, a, f(x), f(y), f(saved)));
      });
      AddOp(backend, reps, report, "attention_backward" + suffix, shape, 0, 2 * flops, [&] {
        BENCH_CHECK_OK(composed ? worker::ComposedAttentionBackward(backend, a, f(x), f(y), f(saved), f(dy), f(dx),
                                                                     f(attn_scratch))
                                : worker::AttentionBackward(backend, a, f(x), f(y), f(saved), f(dy), f(dx),
                                                            f(attn_scratch)));
      });
    }
  }

  std::vector<int32_t> host_targets(kRows);
  for (int64_t i = 0; i < kRows; ++i) host_targets[i] = static_cast<int32_t>(i % kVocab);
  DeviceBuffer targets = std::move(backend.Allocate(kRows * sizeof(int32_t))).value();
  BENCH_CHECK_OK(backend.CopyToDevice(absl::Span<const int32_t>(host_targets), targets.span<int32_t>()));
  // The large model's vocabulary, and GPT-2's (256 rows of 50,304 logits).
  for (const worker::CrossEntropyShape& ce : {worker::CrossEntropyShape{kRows, kVocab},
                                              worker::CrossEntropyShape{256, 50304}}) {
    const bool large = ce.vocab != kVocab;
    DeviceBuffer big_logits = Filled(backend, large ? ce.rows * ce.vocab : 1, 0.1f);
    DeviceBuffer big_grads = Filled(backend, large ? ce.rows * ce.vocab : 1, 0.0f);
    auto logits = large ? f(big_logits) : f(x);
    auto grads = large ? f(big_grads) : f(dx);
    const double logits_bytes = static_cast<double>(ce.rows) * ce.vocab * 4;
    const auto ce_targets = targets.span<int32_t>().subspan(0, static_cast<size_t>(ce.rows));
    AddOp(backend, reps, report, "cross_entropy_forward", absl::StrCat(ce.rows, "x", ce.vocab), logits_bytes, 0,
          [&] { BENCH_CHECK_OK(backend.CrossEntropyForward(ce, logits, ce_targets, f(y))); });
    AddOp(backend, reps, report, "cross_entropy_backward", absl::StrCat(ce.rows, "x", ce.vocab), 3 * logits_bytes,
          0, [&] { BENCH_CHECK_OK(backend.CrossEntropyBackward(ce, logits, ce_targets, 1.0f, grads)); });
  }
  const worker::EmbeddingShape emb{kRows, kVocab, kC};
  AddOp(backend, reps, report, "embedding_backward", act, 3.0 * kN * 4, 0, [&] {
    BENCH_CHECK_OK(backend.EmbeddingBackward(emb, targets.span<int32_t>(), f(dy), f(dx)));
  });

  const size_t params = 4 * kN;  // ~2M parameters
  AddOp(backend, reps, report, "adamw", absl::StrCat(params), 7.0 * params * 4, 0, [&] {
    BENCH_CHECK_OK(backend.AdamWUpdate(worker::AdamWStep{}, f(x), f(dy), f(y), f(dx)));
  });
  AddOp(backend, reps, report, "sum_of_squares", absl::StrCat(params), 1.0 * params * 4, 0,
        [&] { BENCH_CHECK_OK(backend.SumOfSquares(f(x)).status()); });
}

int Main() {
  std::vector<std::string> devices =
      absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipEmpty());
  if (devices.empty()) {
    devices.push_back("cpu");
    if (worker::CudaDeviceCount() > 0) devices.push_back("cuda:0");
  }
  std::vector<int> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_gemm_sizes), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n <= 0 || n > 16384) {
      std::fprintf(stderr, "Error: bad --gemm_sizes entry '%s'\n", std::string(s).c_str());
      return 3;
    }
    sizes.push_back(n);
  }
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  BenchReport report;
  for (const std::string& device : devices) {
    auto backend = worker::CreateBackend(device, {absl::GetFlag(FLAGS_threads)});
    if (!backend.ok()) {
      std::fprintf(stderr, "Error: %s: %s\n", device.c_str(), backend.status().ToString().c_str());
      return 2;
    }
    std::printf("# %s\n", (*backend)->description().c_str());
    const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                         : worker::cpu::TakeOverBlasThreads();
    for (int n : sizes) BenchGemm(**backend, n, threads, reps, report);
    BenchKernels(**backend, reps, report);
  }
  if (absl::Status s = report.Publish(absl::GetFlag(FLAGS_json)); !s.ok()) {
    std::fprintf(stderr, "Error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "GEMM and kernel throughput of each backend");
  return shardline::bench::Main();
}
