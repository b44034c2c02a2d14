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
  auto pieces = Arena::create(chunks * chunk_bytes, PinnedHostMemory::kAlignment);
  if (!address.ok() || !pieces.ok()) {
    (void)cpu_tier.unpin(*block);
    (void)cpu_tier.free(*block);
    return !address.ok() ? address.status() : pieces.status();
  }
  return std::make_unique<StagingPool>(Key(), cpu_tier, *block, static_cast<std::byte*>(*address),
                                       chunk_bytes, chunks, *std::move(pieces));
}

StagingPool::StagingPool(Key, MemoryTier& tier, BlockHandle block, std::byte* base,
                         uint64_t chunk_bytes, uint64_t chunks, Arena pieces)
    : tier_(tier),
      block_(block),
      base_(base),
      chunk_bytes_(chunk_bytes),
      chunk_count_(chunks),
      pieces_(std::move(pieces)) {
  MutexLock lock(&mu_);
  stats_.chunk_bytes = chunk_bytes;
  stats_.chunks = chunks;
  stats_.bytes = chunk_bytes * chunks;
}

StagingPool::~StagingPool() {
  {
    MutexLock lock(&mu_);
    // Leases must not outlive the pool: their memory goes back to the tier below.
    while (stats_.in_use != 0) wait(&changed_, &mu_);
  }
  (void)tier_.unpin(block_);
  (void)tier_.free(block_);
}

std::optional<StagingPool::Lease> StagingPool::take_now(uint64_t bytes) {
  auto piece = pieces_.allocate(bytes);
  if (!piece.ok()) return std::nullopt;
  ++stats_.leases;
  ++stats_.in_use;
  stats_.in_use_bytes += bytes;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return Lease(this, *piece, base_ + pieces_.offset(*piece), bytes);
}

std::optional<StagingPool::Lease> StagingPool::take(uint64_t bytes, bool wait_for_room,
                                                    std::optional<absl::Time> deadline) {
  const uint64_t alignment = PinnedHostMemory::kAlignment;
  const uint64_t size = std::clamp<uint64_t>((bytes + alignment - 1) / alignment * alignment,
                                             alignment, chunk_bytes_);
  MutexLock lock(&mu_);
  if (line_.empty()) {
    if (auto lease = take_now(size)) return lease;
  }
  if (!wait_for_room) return std::nullopt;
  ++stats_.waits;
  const absl::Time start = absl::Now();
  const uint64_t me = next_waiter_++;
  line_.push_back(me);
  std::optional<Lease> lease;
  for (;;) {
    // In turn: a chunk-sized request is not overtaken for ever by small ones that fit sooner.
    if (line_.front() == me && (lease = take_now(size))) break;
    if (!deadline.has_value()) {
      wait(&changed_, &mu_);
      continue;
    }
    const absl::Duration left = *deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    wait_with_timeout(&changed_, &mu_, left);
  }
  std::erase(line_, me);
  changed_.SignalAll();  // the next in line may go now
  stats_.wait_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
  return lease;
}

StagingPool::Lease StagingPool::acquire() { return *take(chunk_bytes_, true, std::nullopt); }

StagingPool::Lease StagingPool::acquire(uint64_t bytes) { return *take(bytes, true, std::nullopt); }

std::optional<StagingPool::Lease> StagingPool::try_acquire() {
  return take(chunk_bytes_, false, std::nullopt);
}

std::optional<StagingPool::Lease> StagingPool::acquire_for(absl::Duration timeout) {
  return take(chunk_bytes_, true, absl::Now() + timeout);
}

void StagingPool::give_back(BlockHandle piece, uint64_t bytes) {
  MutexLock lock(&mu_);
  (void)pieces_.free(piece);
  --stats_.in_use;
  stats_.in_use_bytes -= bytes;
  changed_.SignalAll();  // the first in line may fit now; the destructor may be waiting
}

StagingStats StagingPool::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void StagingPool::reset_peak() {
  MutexLock lock(&mu_);
  stats_.peak_in_use = stats_.in_use;
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

StagingPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      piece_(other.piece_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    piece_ = other.piece_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

StagingPool::Lease::~Lease() { release(); }

void StagingPool::Lease::release() {
  if (pool_ != nullptr) {
    pool_->give_back(piece_, bytes_);
    pool_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }
}

}  // namespace strata
