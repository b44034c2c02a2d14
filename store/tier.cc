#include "strata/store/tier.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <cstring>

#include "pinned_pieces.h"
#include "strata/base/debug.h"
#include "strata/base/mutex.h"
#include "strata/base/size.h"

namespace strata {

std::string_view to_string(TierKind kind) {
  switch (kind) {
    case TierKind::kGpu:
      return "gpu";
    case TierKind::kCpu:
      return "cpu";
    case TierKind::kNvme:
      return "nvme";
  }
  return "unknown";
}

// The memory behind a tier: device memory or a host slab pinned in pieces, plus the compaction
// bounce buffer (GPU only).
struct MemoryTier::Region {
  std::unique_ptr<DeviceMemory> device_memory;
  std::unique_ptr<PinnedPieces> pieces;
  std::byte* base = nullptr;
  std::byte* bounce = nullptr;
  uint64_t bounce_bytes = 0;
};

namespace {

// Slides by at least this much are copied directly in gap-sized steps; smaller slides of large
// blocks go through the bounce buffer instead, so no move needs more than a few hundred copies.
constexpr uint64_t kMinDirectStep = uint64_t{4} << 20;
constexpr uint64_t kMaxBounce = uint64_t{64} << 20;

absl::Status with_context(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("%s: %s", context, status.message()));
}

}  // namespace

MemoryTier::MemoryTier(Key, TierKind kind, Device& device, std::unique_ptr<Region> region,
                       Arena arena)
    : kind_(kind), device_(device), region_(std::move(region)), arena_(std::move(arena)) {}

MemoryTier::~MemoryTier() {
  MutexLock lock(&mu_);
  // Compaction copies still in flight write into the region freed below.
  if (compaction_stream_ != nullptr) (void)device_.synchronize(*compaction_stream_);
}

absl::StatusOr<std::unique_ptr<MemoryTier>> MemoryTier::create_gpu_arena(Device& device,
                                                                         uint64_t bytes,
                                                                         uint64_t alignment) {
  if (bytes < 2 * alignment || alignment == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GPU arena of %d bytes (alignment %d) is too small; set STRATA_GPU_BYTES to at least %s",
        bytes, alignment, format_bytes(std::max<uint64_t>(2 * alignment, 4096))));
  }
  auto region = std::make_unique<Region>();
  uint64_t bounce = std::min(kMaxBounce, bytes / 64) / alignment * alignment;
  if (bounce == 0) bounce = alignment;
  const uint64_t arena_bytes = (bytes - bounce) / alignment * alignment;
  auto memory = device.allocate_device_memory(bytes);
  if (!memory.ok()) return with_context(memory.status(), "creating the GPU arena");
  region->device_memory = *std::move(memory);
  region->base = static_cast<std::byte*>(region->device_memory->data());
  region->bounce = region->base + arena_bytes;
  region->bounce_bytes = bounce;
  auto arena = Arena::create(arena_bytes, alignment);
  if (!arena.ok()) return with_context(arena.status(), "creating the GPU arena");
  auto stream = device.create_stream();
  if (!stream.ok()) return with_context(stream.status(), "creating the GPU arena");
  auto event = device.create_event();
  if (!event.ok()) return with_context(event.status(), "creating the GPU arena");
  auto tier = std::make_unique<MemoryTier>(Key(), TierKind::kGpu, device, std::move(region),
                                           *std::move(arena));
  MutexLock lock(&tier->mu_);
  tier->compaction_stream_ = *std::move(stream);
  tier->compaction_done_ = std::shared_ptr<Event>(*std::move(event));
  return tier;
}

absl::StatusOr<std::unique_ptr<MemoryTier>> MemoryTier::create_pinned_cpu(Device& device,
                                                                          uint64_t bytes,
                                                                          uint64_t piece_bytes) {
  constexpr uint64_t kAlignment = PinnedHostMemory::kAlignment;
  if (bytes < kAlignment) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pinned CPU tier of %d bytes is too small; set STRATA_CPU_BYTES to at least 4KiB", bytes));
  }
  auto region = std::make_unique<Region>();
  const uint64_t arena_bytes = bytes / kAlignment * kAlignment;
  auto pieces =
      PinnedPieces::create(device, arena_bytes, piece_bytes, "pinned CPU tier (STRATA_CPU_BYTES)");
  if (!pieces.ok()) return pieces.status();
  region->pieces = *std::move(pieces);
  region->base = region->pieces->base();
  auto arena = Arena::create(arena_bytes, kAlignment);
  if (!arena.ok()) return with_context(arena.status(), "creating the pinned CPU tier");
  return std::make_unique<MemoryTier>(Key(), TierKind::kCpu, device, std::move(region),
                                      *std::move(arena));
}

uint64_t MemoryTier::capacity() const {
  MutexLock lock(&mu_);
  return arena_.capacity();
}

void* MemoryTier::base() const { return region_->base; }

uint64_t MemoryTier::piece_bytes() const {
  return region_->pieces != nullptr ? region_->pieces->piece_bytes() : 0;
}

void MemoryTier::set_piece_listener(absl::AnyInvocable<void(uint32_t piece)> listener) {
  if (region_->pieces != nullptr) region_->pieces->set_listener(std::move(listener));
}

void MemoryTier::wait_piece_listener() const {
  if (region_->pieces != nullptr) region_->pieces->wait_listener_idle();
}

std::string MemoryTier::pinning_warning() const {
  return region_->pieces != nullptr ? region_->pieces->warning() : std::string();
}

absl::StatusOr<BlockHandle> MemoryTier::allocate(uint64_t bytes, Placement placement) {
  absl::StatusOr<BlockHandle> block;
  uint64_t offset = 0, size = 0;
  {
    MutexLock lock(&mu_);
    const uint64_t compactions_before = STRATA_DEBUG_CHECKS ? arena_.stats().compactions : 0;
    block = arena_.allocate_compacting(
        bytes, 0,
        [this](const CompactionPlan& plan)
            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return execute_moves(plan); },
        placement);
    // Compaction rewrites the arena's structure: walk all of it in debug builds.
    if (STRATA_DEBUG_CHECKS && arena_.stats().compactions != compactions_before) {
      STRATA_DCHECK_OK(arena_.check_invariants());
    }
    if (block.ok()) {
      offset = arena_.offset(*block);
      size = arena_.size(*block);
    }
  }
  // Outside the tier's lock: pinning a new piece takes milliseconds, and allocations in pieces
  // already pinned need not wait for it. The caller has the block only after this.
  if (block.ok() && region_->pieces != nullptr) region_->pieces->ensure(offset, size);
  return block;
}

absl::Status MemoryTier::free(BlockHandle block) {
  MutexLock lock(&mu_);
  return arena_.free(block);
}

absl::StatusOr<void*> MemoryTier::address(BlockHandle block) const {
  MutexLock lock(&mu_);
  auto offset = arena_.checked_offset(block);
  if (!offset.ok()) return offset.status();
  return region_->base + *offset;
}

absl::Status MemoryTier::pin(BlockHandle block) {
  MutexLock lock(&mu_);
  return arena_.pin(block);
}

absl::Status MemoryTier::unpin(BlockHandle block) {
  MutexLock lock(&mu_);
  return arena_.unpin(block);
}

std::shared_ptr<Event> MemoryTier::pending_compaction() const {
  MutexLock lock(&mu_);
  if (!compacted_) return nullptr;
  auto done = device_.query(*compaction_done_);
  if (done.ok() && *done) return nullptr;
  return compaction_done_;  // an error here is the device's: waiting on it reports it again
}

absl::Status MemoryTier::order_after_compaction(Stream& stream) const {
  std::shared_ptr<Event> pending = pending_compaction();
  if (pending == nullptr) return absl::OkStatus();
  return with_context(device_.wait(stream, *pending), "waiting for GPU arena compaction");
}

absl::Status MemoryTier::synchronize_compaction() const {
  std::shared_ptr<Event> pending = pending_compaction();
  if (pending == nullptr) return absl::OkStatus();
  return with_context(device_.synchronize(*pending), "waiting for GPU arena compaction");
}

void MemoryTier::reset_peak() {
  MutexLock lock(&mu_);
  arena_.reset_peak();
}

void MemoryTier::reserve_high(uint64_t bytes) {
  MutexLock lock(&mu_);
  high_reserved_ += bytes;
  arena_.set_high_reserve(high_reserved_);
}

void MemoryTier::unreserve_high(uint64_t bytes) {
  MutexLock lock(&mu_);
  high_reserved_ -= std::min(bytes, high_reserved_);
  arena_.set_high_reserve(high_reserved_);
}

TierStats MemoryTier::stats() const {
  MutexLock lock(&mu_);
  TierStats stats;
  stats.kind = kind_;
  stats.arena = arena_.stats();
  stats.compaction_copies = compaction_copies_;
  if (region_->pieces != nullptr) stats.pinning = region_->pieces->stats();
  return stats;
}

absl::Status MemoryTier::check_invariants() const {
  MutexLock lock(&mu_);
  return arena_.check_invariants();
}

absl::Status MemoryTier::execute_moves(const CompactionPlan& plan) {
  const uint64_t capacity = arena_.capacity();
  // Validate everything before touching a byte: a plan that fails half-way could lose data.
  for (const CompactionMove& move : plan.moves) {
    if (move.to >= move.from || move.from + move.bytes > capacity) {
      return absl::InternalError(absl::StrFormat(
          "compaction plan moves %d bytes from %d to %d in a %d-byte arena; refusing to run it",
          move.bytes, move.from, move.to, capacity));
    }
  }
  if (kind_ == TierKind::kCpu) {
    // Host memory: memmove handles overlap, and no device work touches unpinned blocks. A block
    // may land in a piece never used before: pin it first, as allocate() does.
    for (const CompactionMove& move : plan.moves) {
      region_->pieces->ensure(move.to, move.bytes);
      std::memmove(region_->base + move.to, region_->base + move.from, move.bytes);
      ++compaction_copies_;
    }
    return absl::OkStatus();
  }
  for (const CompactionMove& move : plan.moves) {
    if (auto status =
            move_on_device(region_->base + move.to, region_->base + move.from, move.bytes);
        !status.ok()) {
      // Copies already queued may have overwritten parts of their sources: wait for them, then
      // report; the device is in an unknown state only if the device itself failed.
      (void)device_.synchronize(*compaction_stream_);
      return with_context(status, "GPU arena compaction");
    }
  }
  // Not waited for: later device work on the arena is ordered after this record (see tier.h).
  compacted_ = true;
  if (auto status = device_.record(*compaction_done_, *compaction_stream_); !status.ok()) {
    // Nothing could be ordered after the copies: wait for them here instead.
    return with_context(device_.synchronize(*compaction_stream_), "GPU arena compaction");
  }
  return absl::OkStatus();
}

// Moves [src, src + bytes) down to dst < src, ranges possibly overlapping, in stream order.
// Every step's destination covers only bytes already copied, so forward order is safe.
absl::Status MemoryTier::move_on_device(std::byte* dst, const std::byte* src, uint64_t bytes) {
  const uint64_t gap = static_cast<uint64_t>(src - dst);
  Stream& stream = *compaction_stream_;
  if (gap >= bytes || gap >= kMinDirectStep) {
    const uint64_t step = std::min(gap, bytes);
    for (uint64_t done = 0; done < bytes; done += step) {
      const uint64_t n = std::min(step, bytes - done);
      if (auto status =
              device_.copy_async(dst + done, src + done, n, CopyKind::kDeviceToDevice, stream);
          !status.ok()) {
        return status;
      }
      ++compaction_copies_;
    }
    return absl::OkStatus();
  }
  const uint64_t step = region_->bounce_bytes;
  for (uint64_t done = 0; done < bytes; done += step) {
    const uint64_t n = std::min(step, bytes - done);
    if (auto status =
            device_.copy_async(region_->bounce, src + done, n, CopyKind::kDeviceToDevice, stream);
        !status.ok()) {
      return status;
    }
    if (auto status =
            device_.copy_async(dst + done, region_->bounce, n, CopyKind::kDeviceToDevice, stream);
        !status.ok()) {
      return status;
    }
    compaction_copies_ += 2;
  }
  return absl::OkStatus();
}

}  // namespace strata
