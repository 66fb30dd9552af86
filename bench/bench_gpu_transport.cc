// bench_gpu_transport: the host side of a GPU stage's transport, on one GPU.
//   copy:    H2D and D2H GB/s from pinned (cudaHostAlloc) and from pageable
//            memory, `--copy_mib` per copy, median of `--trials`;
//   overlap: a D2H copy on its own stream while cuBLAS runs GEMMs on
//            another; overlap = (t_gemm + t_copy − t_both) / min(t_gemm, t_copy)
//            (1: the copy hid entirely under compute, 0: they serialised);
//   hop:     one tensor GPU → host → StageLink over loopback gRPC → host →
//            GPU (what a CUDA stage does today: pageable staging), checked
//            byte for byte against what was sent, with its GB/s.
// Exits non-zero when no device is found or a hop arrives corrupted.
//
//   bench_gpu_transport [--copy_mib=256] [--hop_mib=16,64] [--trials=5] [--json=FILE]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_report.h"
#include "common/init.h"
#include "worker/backend/backend_factory.h"
#include "worker/transport/grpc_stage_link.h"
#include "worker/transport/stage_link_service.h"

ABSL_FLAG(int, copy_mib, 256, "MiB per copy in the copy and overlap measurements");
ABSL_FLAG(std::string, hop_mib, "16,64", "tensor MiB of the GPU→wire→GPU hops");
ABSL_FLAG(int, trials, 5, "measurements per figure (median)");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");

namespace shardline::bench {
namespace {

using worker::transport::StageMessage;
using Clock = std::chrono::steady_clock;

#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t e = (call);                                                               \
    if (e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "Error: %s: %s\n", #call, cudaGetErrorString(e));              \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of `work` enqueued on `stream`, by events; median of the trials.
template <typename F>
double TimeOnStream(cudaStream_t stream, F work) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  work();  // warm-up
  std::vector<double> seconds;
  for (int t = 0; t < absl::GetFlag(FLAGS_trials); ++t) {
    CUDA_OK(cudaEventRecord(start, stream));
    work();
    CUDA_OK(cudaEventRecord(stop, stream));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    seconds.push_back(ms / 1e3);
  }
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  return Median(seconds);
}

void MeasureCopies(BenchReport& report, size_t bytes, void* device, cudaStream_t stream) {
  void* pinned = nullptr;
  CUDA_OK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  std::vector<char> pageable(bytes, 1);
  for (const bool use_pinned : {true, false}) {
    void* host = use_pinned ? pinned : pageable.data();
    const double h2d = TimeOnStream(stream, [&] {
      CUDA_OK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
    });
    const double d2h = TimeOnStream(stream, [&] {
      CUDA_OK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
    });
    report.Add({{"check", use_pinned ? "copy_pinned" : "copy_pageable"},
                {"bytes", static_cast<double>(bytes)},
                {"h2d_gbps", bytes / h2d / 1e9},
                {"d2h_gbps", bytes / d2h / 1e9}});
  }
  CUDA_OK(cudaFreeHost(pinned));
}

// One row of a copy measured alone, GEMMs alone and both together; overlap
// 1: the copy hid entirely under the GEMMs, 0: they ran one after the other.
void AddOverlapRow(BenchReport& report, const char* check, size_t bytes, double t_gemm,
                   double t_copy, double t_both) {
  report.Add({{"check", check},
              {"bytes", static_cast<double>(bytes)},
              {"gemm_ms", t_gemm * 1e3},
              {"copy_ms", t_copy * 1e3},
              {"both_ms", t_both * 1e3},
              {"overlap", (t_gemm + t_copy - t_both) / std::min(t_gemm, t_copy)}});
}

void MeasureOverlap(BenchReport& report, size_t bytes, void* device) {
  constexpr int n = 4096, gemms = 8;
  float *a = nullptr, *c = nullptr;
  CUDA_OK(cudaMalloc(&a, sizeof(float) * n * n));
  CUDA_OK(cudaMalloc(&c, sizeof(float) * n * n));
  CUDA_OK(cudaMemset(a, 0, sizeof(float) * n * n));
  void* pinned = nullptr;
  CUDA_OK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  cudaStream_t compute, copy;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "Error: cublasCreate failed\n");
    std::exit(2);
  }
  cublasSetStream(blas, compute);
  const float one = 1.0f, zero = 0.0f;
  auto run_gemms = [&] {
    for (int i = 0; i < gemms; ++i) {
      cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, a, n, &zero, c, n);
    }
  };
  auto run_copy = [&] { CUDA_OK(cudaMemcpyAsync(pinned, device, bytes, cudaMemcpyDeviceToHost, copy)); };
  auto wall = [&](auto work) {
    work();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> seconds;
    for (int t = 0; t < absl::GetFlag(FLAGS_trials); ++t) {
      const auto start = Clock::now();
      work();
      CUDA_OK(cudaDeviceSynchronize());
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    return Median(seconds);
  };
  const double t_gemm = wall(run_gemms);
  const double t_copy = wall(run_copy);
  const double t_both = wall([&] {
    run_gemms();
    run_copy();
  });
  AddOverlapRow(report, "d2h_under_gemm", bytes, t_gemm, t_copy, t_both);
  cublasDestroy(blas);
  CUDA_OK(cudaStreamDestroy(compute));
  CUDA_OK(cudaStreamDestroy(copy));
  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(c));
}

// The same through our Backend: CopyToHostAsync of one tensor, then GEMMs
// queued after it, as a stage queues micro-batch k+1's compute behind the
// copy of k's output; and an upload after a mark, behind GEMMs. Overlap near
// 1 means the copy runs under the GEMMs.
void MeasureBackendOverlap(BenchReport& report, size_t bytes) {
  auto backend = worker::CreateBackend("cuda:0");
  BENCH_CHECK_OK(backend.status());
  worker::Backend& b = **backend;
  constexpr int64_t n = 4096;
  constexpr int gemms = 8;
  auto a = b.AllocateZeros(n * n);
  auto c = b.AllocateZeros(n * n);
  auto source = b.AllocateZeros(bytes / sizeof(float));
  BENCH_CHECK_OK(a.status());
  BENCH_CHECK_OK(c.status());
  BENCH_CHECK_OK(source.status());
  auto staging = b.AllocateHostStaging(bytes);
  BENCH_CHECK_OK(staging.status());
  const absl::Span<float> host(static_cast<float*>(*staging), bytes / sizeof(float));
  worker::GemmShape shape;
  shape.m = shape.n = shape.k = n;
  auto run_gemms = [&] {
    for (int i = 0; i < gemms; ++i) {
      BENCH_CHECK_OK(b.Gemm(shape, a->span<float>(), a->span<float>(), c->span<float>()));
    }
  };
  auto run_copy = [&] {
    auto copy = b.CopyToHostAsync(worker::DeviceSpan<const float>(source->span<float>()), host);
    BENCH_CHECK_OK(copy.status());
    return *copy;
  };
  auto wall = [&](auto work) {
    work();
    std::vector<double> seconds;
    for (int t = 0; t <= absl::GetFlag(FLAGS_trials); ++t) {  // the first is the warm-up
      BENCH_CHECK_OK(b.Synchronize());
      const auto start = Clock::now();
      work();
      if (t > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    return Median(seconds);
  };
  const double t_gemm = wall([&] {
    run_gemms();
    BENCH_CHECK_OK(b.Synchronize());
  });
  const double t_copy = wall([&] { BENCH_CHECK_OK(run_copy().Wait()); });
  const double t_both = wall([&] {
    worker::HostTransfer copy = run_copy();
    run_gemms();
    BENCH_CHECK_OK(b.Synchronize());
    BENCH_CHECK_OK(copy.Wait());
  });
  AddOverlapRow(report, "backend_d2h_under_gemm", bytes, t_gemm, t_copy, t_both);
  // And an upload queued behind the GEMMs, allowed to start once `source`'s
  // last use (none here) is done, as a stage uploads the next micro-batch's
  // input into a free slot while the current one computes.
  auto run_upload = [&](const worker::HostTransfer& after) {
    auto copy = b.CopyToDeviceAsync(absl::Span<const float>(host), source->span<float>(), after);
    BENCH_CHECK_OK(copy.status());
    return *copy;
  };
  auto free_now = b.MarkQueued();
  BENCH_CHECK_OK(free_now.status());
  BENCH_CHECK_OK(b.Synchronize());
  const double t_upload = wall([&] {
    BENCH_CHECK_OK(run_upload(*free_now).Wait());
    BENCH_CHECK_OK(b.Synchronize());
  });
  const double t_both_up = wall([&] {
    run_gemms();
    worker::HostTransfer copy = run_upload(*free_now);
    BENCH_CHECK_OK(b.Synchronize());
    BENCH_CHECK_OK(copy.Wait());
  });
  AddOverlapRow(report, "backend_h2d_under_gemm", bytes, t_gemm, t_upload, t_both_up);
  b.FreeHostStaging(*staging);
}

// One tensor from device memory to device memory through a real stage link.
bool MeasureHop(BenchReport& report, size_t bytes) {
  worker::transport::StageLinkService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  service.RegisterWith(builder);
  auto server = builder.BuildAndStart();
  worker::transport::ExchangeOptions exchange;
  exchange.timeout = absl::Seconds(60);
  auto sender = service.Expect("hop", 1, 0, exchange);
  worker::transport::GrpcStageLinkOptions options;
  options.job_id = "hop";
  options.plan_epoch = 1;
  options.stage = 1;
  options.stages = 2;
  options.upstream_address = absl::StrCat("127.0.0.1:", port);
  options.exchange = exchange;
  auto receiver = worker::transport::GrpcStageLink::Create(options);
  BENCH_CHECK_OK(receiver.status());

  const size_t n = bytes / sizeof(float);
  std::vector<float> original(n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : original) v = uniform(rng);
  float *from = nullptr, *to = nullptr;
  CUDA_OK(cudaMalloc(&from, bytes));
  CUDA_OK(cudaMalloc(&to, bytes));
  CUDA_OK(cudaMemcpy(from, original.data(), bytes, cudaMemcpyHostToDevice));
  bool intact = true;
  std::vector<double> seconds;
  for (int t = 0; t <= absl::GetFlag(FLAGS_trials); ++t) {  // the first is the warm-up
    CUDA_OK(cudaMemset(to, 0, bytes));
    CUDA_OK(cudaDeviceSynchronize());
    const auto start = Clock::now();
    StageMessage message;
    message.kind = StageMessage::Kind::kActivation;
    message.step = t + 1;
    message.values = worker::transport::HostBuffer::Zeros(n);
    CUDA_OK(cudaMemcpy(message.values.data(), from, bytes, cudaMemcpyDeviceToHost));
    BENCH_CHECK_OK(sender->Send(std::make_shared<const StageMessage>(std::move(message))));
    absl::StatusOr<StageMessage> received = (*receiver)->ReceiveFromPrevious();
    BENCH_CHECK_OK(received.status());
    CUDA_OK(cudaMemcpy(to, received->values.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    if (t > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    std::vector<float> back(n);
    CUDA_OK(cudaMemcpy(back.data(), to, bytes, cudaMemcpyDeviceToHost));
    intact = intact && std::memcmp(back.data(), original.data(), bytes) == 0;
  }
  report.Add({{"check", "gpu_wire_gpu_hop"},
              {"bytes", static_cast<double>(bytes)},
              {"hop_gbps", bytes / Median(seconds) / 1e9},
              {"intact", intact ? 1.0 : 0.0}});
  receiver->reset();
  sender->Close("done");
  server->Shutdown();
  CUDA_OK(cudaFree(from));
  CUDA_OK(cudaFree(to));
  return intact;
}

int Main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "Error: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);
  const size_t copy_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_copy_mib)) << 20;
  void* device = nullptr;
  CUDA_OK(cudaMalloc(&device, copy_bytes));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  BenchReport report;
  MeasureCopies(report, copy_bytes, device, stream);
  MeasureOverlap(report, copy_bytes, device);
  MeasureBackendOverlap(report, copy_bytes);
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(device));
  bool intact = true;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_hop_mib), ',', absl::SkipEmpty())) {
    int mib = 0;
    if (!absl::SimpleAtoi(s, &mib) || mib < 1 || mib > 4096) {
      std::fprintf(stderr, "Error: bad --hop_mib entry '%s'\n", std::string(s).c_str());
      return 3;
    }
    intact = MeasureHop(report, static_cast<size_t>(mib) << 20) && intact;
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  if (!intact) std::fprintf(stderr, "Error: a hop arrived corrupted\n");
  return intact ? 0 : 1;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(
      argc, argv, "pinned/pageable copies, copy-compute overlap (raw CUDA and the Backend's), GPU→wire→GPU hop");
  return shardline::bench::Main();
}
