#include "strata/store/staging.h"

#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <utility>

#include "strata/base/format_bytes.h"
#include "strata/base/mutex.h"

namespace strata {

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::create(MemoryTier& cpu_tier,
                                                                 uint64_t bytes,
                                                                 uint64_t chunk_bytes) {
  if (cpu_tier.kind() != TierKind::kCpu) {
    return absl::InvalidArgumentError("staging buffers must come from the pinned CPU tier");
  }
  if (chunk_bytes == 0 || chunk_bytes % PinnedHostMemory::kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "staging chunk of %d bytes: must be a positive multiple of 4096 (STRATA_IO_BLOCK)",
        chunk_bytes));
  }
  const uint64_t chunks = bytes / chunk_bytes;
  if (chunks == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("STRATA_STAGING_BYTES=%s holds no %s chunk; raise it to at least %s",
                        format_bytes(bytes), format_bytes(chunk_bytes), format_bytes(chunk_bytes)));
  }
  if (chunks > UINT32_MAX) {
    return absl::InvalidArgumentError("too many staging chunks; use larger chunks");
  }
  auto block = cpu_tier.allocate(chunks * chunk_bytes);
  if (!block.ok()) {
    return absl::Status(
        block.status().code(),
        absl::StrFormat("reserving %s of staging (STRATA_STAGING_BYTES) in the "
                        "pinned CPU tier: %s; raise STRATA_CPU_BYTES or lower "
                        "STRATA_STAGING_BYTES",
                        format_bytes(chunks * chunk_bytes), block.status().message()));
  }
  // Pinned for the pool's life: DMA and io_uring hold these addresses, compaction must not move.
  if (auto status = cpu_tier.pin(*block); !status.ok()) {
    (void)cpu_tier.free(*block);
    return status;
  }
  auto address = cpu_tier.address(*block);
  if (!address.ok()) {
    (void)cpu_tier.unpin(*block);
    (void)cpu_tier.free(*block);
    return address.status();
  }
  return std::make_unique<StagingPool>(Key(), cpu_tier, *block, static_cast<std::byte*>(*address),
                                       chunk_bytes, chunks);
}

StagingPool::StagingPool(Key, MemoryTier& tier, BlockHandle block, std::byte* base,
                         uint64_t chunk_bytes, uint64_t chunks)
    : tier_(tier), block_(block), base_(base), chunk_bytes_(chunk_bytes), chunk_count_(chunks) {
  MutexLock lock(&mu_);
  free_chunks_.reserve(chunks);
  for (uint64_t i = chunks; i > 0; --i) free_chunks_.push_back(static_cast<uint32_t>(i - 1));
  stats_.chunk_bytes = chunk_bytes;
  stats_.chunks = chunks;
}

StagingPool::~StagingPool() {
  {
    MutexLock lock(&mu_);
    // Leases must not outlive the pool: their memory goes back to the tier below.
    while (free_chunks_.size() != chunk_count_) wait(&freed_, &mu_);
  }
  (void)tier_.unpin(block_);
  (void)tier_.free(block_);
}

StagingPool::Lease StagingPool::take_locked() {
  const uint32_t chunk = free_chunks_.back();
  free_chunks_.pop_back();
  ++stats_.leases;
  stats_.in_use = chunk_count_ - free_chunks_.size();
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return Lease(this, chunk, base_ + uint64_t{chunk} * chunk_bytes_, chunk_bytes_);
}

StagingPool::Lease StagingPool::acquire() {
  MutexLock lock(&mu_);
  if (free_chunks_.empty()) {
    ++stats_.waits;
    const absl::Time start = absl::Now();
    while (free_chunks_.empty()) wait(&freed_, &mu_);
    stats_.wait_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
  }
  return take_locked();
}

std::optional<StagingPool::Lease> StagingPool::try_acquire() {
  MutexLock lock(&mu_);
  if (free_chunks_.empty()) return std::nullopt;
  return take_locked();
}

std::optional<StagingPool::Lease> StagingPool::acquire_for(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  if (free_chunks_.empty()) {
    ++stats_.waits;
    const absl::Time start = absl::Now();
    while (free_chunks_.empty()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      wait_with_timeout(&freed_, &mu_, left);
    }
    stats_.wait_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
    if (free_chunks_.empty()) return std::nullopt;
  }
  return take_locked();
}

void StagingPool::give_back(uint32_t chunk) {
  MutexLock lock(&mu_);
  free_chunks_.push_back(chunk);
  stats_.in_use = chunk_count_ - free_chunks_.size();
  freed_.Signal();
  if (free_chunks_.size() == chunk_count_) freed_.SignalAll();  // the destructor may wait
}

StagingStats StagingPool::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

StagingPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      chunk_(other.chunk_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    chunk_ = other.chunk_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

StagingPool::Lease::~Lease() { release(); }

void StagingPool::Lease::release() {
  if (pool_ != nullptr) {
    pool_->give_back(chunk_);
    pool_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }
}

}  // namespace strata
