#include "tests/testing/deferred_copy_backend.h"

#include <cstring>
#include <iterator>
#include <utility>

#include "common/status_macros.h"

namespace shardline::testing {

DeferredCopyBackend::DeferredCopyBackend(absl::Duration delay)
    : delay_(delay), thread_([this] { Run(); }) {}

DeferredCopyBackend::~DeferredCopyBackend() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

namespace {

uint64_t Fnv1a(const void* data, size_t bytes) {
  uint64_t hash = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

}  // namespace

int DeferredCopyBackend::deferred_copies() {
  absl::MutexLock lock(&mu_);
  return finished_;
}

int DeferredCopyBackend::host_changes_seen() {
  absl::MutexLock lock(&mu_);
  return host_changes_;
}

int DeferredCopyBackend::uploads_from_pageable() {
  absl::MutexLock lock(&mu_);
  return pageable_uploads_;
}

void DeferredCopyBackend::Hold() {
  absl::MutexLock lock(&mu_);
  held_ = true;
}

void DeferredCopyBackend::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
  for (const auto& completion : queued_while_held_) {
    released_waits_ += completion->blocked_waits();
    completion->RefuseToBlock(false);
  }
  queued_while_held_.clear();
}

int DeferredCopyBackend::waits_while_held() {
  absl::MutexLock lock(&mu_);
  int waits = released_waits_;
  for (const auto& completion : queued_while_held_) waits += completion->blocked_waits();
  return waits;
}

absl::StatusOr<void*> DeferredCopyBackend::AllocateHostStaging(size_t bytes) {
  ASSIGN_OR_RETURN(void* memory, CpuBackend::AllocateHostStaging(bytes));
  absl::MutexLock lock(&mu_);
  staging_[static_cast<const char*>(memory)] = bytes;
  return memory;
}

void DeferredCopyBackend::FreeHostStaging(void* memory) {
  {
    absl::MutexLock lock(&mu_);
    staging_.erase(static_cast<const char*>(memory));
  }
  CpuBackend::FreeHostStaging(memory);
}

worker::HostTransfer DeferredCopyBackend::Queue(Pending pending) {
  pending.due = absl::Now() + delay_;
  pending.completion = std::make_shared<ManualCompletion>();
  worker::HostTransfer transfer(pending.completion);
  absl::MutexLock lock(&mu_);
  if (held_) {
    pending.completion->RefuseToBlock(true);
    queued_while_held_.push_back(pending.completion);
  }
  queue_.push_back(std::move(pending));
  return transfer;
}

absl::StatusOr<worker::HostTransfer> DeferredCopyBackend::CopyToHostAsyncImpl(const void* src,
                                                                              void* dst,
                                                                              size_t bytes) {
  Pending copy;  // the bytes are read when the copy runs
  copy.src = src;
  copy.dst = dst;
  copy.bytes = bytes;
  return Queue(std::move(copy));
}

absl::StatusOr<worker::HostTransfer> DeferredCopyBackend::CopyToDeviceAsyncImpl(
    const void* src, void* dst, size_t bytes, const worker::HostTransfer* after) {
  if (after != nullptr) RETURN_IF_ERROR(after->Wait());
  {
    absl::MutexLock lock(&mu_);
    const char* p = static_cast<const char*>(src);
    auto it = staging_.upper_bound(p);  // the first block starting after p
    const bool staged = it != staging_.begin() && p + bytes <= std::prev(it)->first + std::prev(it)->second;
    if (!staged) ++pageable_uploads_;
  }
  // The work queued next reads `dst` at once (the CPU computes as work is
  // queued), so the bytes move now; the host memory counts as read later.
  std::memcpy(dst, src, bytes);
  Pending read;
  read.read = src;
  read.bytes = bytes;
  read.read_hash = Fnv1a(src, bytes);
  return Queue(std::move(read));
}

void DeferredCopyBackend::Run() {
  while (true) {
    Pending next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return (!queue_.empty() && !held_) || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    const absl::Duration wait = next.due - absl::Now();
    if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
    if (next.src != nullptr) std::memcpy(next.dst, next.src, next.bytes);
    const bool changed = next.read != nullptr && Fnv1a(next.read, next.bytes) != next.read_hash;
    next.completion->Finish();
    absl::MutexLock lock(&mu_);
    ++finished_;
    if (changed) ++host_changes_;
  }
}

}  // namespace shardline::testing
