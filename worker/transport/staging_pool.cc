#include "worker/transport/staging_pool.h"

#include "absl/strings/str_cat.h"

namespace shardline::worker::transport {

HostMemory PlainHostMemory() {
  HostMemory memory;
  memory.allocate = &Backend::AllocatePlainHost;
  memory.release = &Backend::FreePlainHost;
  return memory;
}

HostMemory HostStagingMemory(Backend& backend) {
  HostMemory memory;
  memory.allocate = [&backend](size_t bytes) { return backend.AllocateHostStaging(bytes); };
  memory.release = [&backend](void* p) { backend.FreeHostStaging(p); };
  memory.pinned = backend.host_staging_pinned();
  return memory;
}

StagingSlot::StagingSlot(StagingSlot&& other) noexcept
    : pool_(std::move(other.pool_)), memory_(other.memory_) {
  other.memory_ = nullptr;
}

StagingSlot& StagingSlot::operator=(StagingSlot&& other) noexcept {
  if (this != &other) {
    if (memory_ != nullptr) pool_->Return(memory_);
    pool_ = std::move(other.pool_);
    memory_ = other.memory_;
    other.memory_ = nullptr;
  }
  return *this;
}

StagingSlot::~StagingSlot() {
  if (memory_ != nullptr) pool_->Return(memory_);
}

size_t StagingSlot::bytes() const { return pool_ != nullptr ? pool_->slot_bytes() : 0; }

absl::StatusOr<std::shared_ptr<StagingPool>> StagingPool::Create(size_t slot_bytes, int slots,
                                                                 HostMemory memory) {
  if (slot_bytes == 0 || slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a staging pool of ", slots, " × ", slot_bytes, " bytes"));
  }
  std::shared_ptr<StagingPool> pool(new StagingPool(slot_bytes, std::move(memory)));
  for (int i = 0; i < slots; ++i) {
    absl::StatusOr<void*> slot = pool->memory_.allocate(slot_bytes);
    if (!slot.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("staging slot ", i + 1, " of ", slots, " (", slot_bytes,
                                                       " bytes): ", slot.status().message()));
    }
    pool->all_.push_back(*slot);
  }
  absl::MutexLock lock(&pool->mu_);
  pool->free_ = pool->all_;
  return pool;
}

StagingPool::~StagingPool() {
  // Every slot is back: each handle holds the pool alive.
  for (void* slot : all_) memory_.release(slot);
}

StagingSlot StagingPool::Take() {
  void* memory = free_.back();
  free_.pop_back();
  peak_in_use_ = std::max(peak_in_use_, slots() - static_cast<int>(free_.size()));
  return StagingSlot(shared_from_this(), memory);
}

std::optional<StagingSlot> StagingPool::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) return std::nullopt;
  return Take();
}

int StagingPool::free_slots() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(free_.size());
}

int StagingPool::peak_in_use() {
  absl::MutexLock lock(&mu_);
  return peak_in_use_;
}

void StagingPool::Return(void* memory) {
  absl::MutexLock lock(&mu_);
  free_.push_back(memory);
}

}  // namespace shardline::worker::transport
