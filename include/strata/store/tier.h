// A memory tier: one region of memory (a device allocation or a pinned host slab) managed by an
// Arena. The GPU arena and the pinned CPU tier are MemoryTiers.
//
// Thread-safe. Blocks are stable handles; a block's address changes only when compaction moves
// it, and compaction never moves a pinned block. Callers pin a block for as long as device work
// or host code uses its address.
//
// GPU compaction is stream-ordered: its copies run on the tier's own stream and allocate() does
// not wait for them. Device work that uses a block's address after an allocate() (the moved
// blocks, and new blocks that may overlap where they were) must be ordered after them:
// order_after_compaction(stream), or pending_compaction() as an event to wait on. Host code that
// touches arena memory directly (possible only on the host backend) calls
// synchronize_compaction() first. The CPU tier compacts with memmove on the calling thread.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "strata/allocator/arena.h"
#include "strata/device/device.h"

namespace strata {

enum class TierKind { kGpu, kCpu, kNvme };

std::string_view to_string(TierKind kind);

// The pinned CPU tier's slab is pinned in pieces as the tier fills (store/pinned_pieces.h): a
// piece with the device when the tier first hands out bytes in it, then handed to the listener
// (the NVMe engine's io_uring registration) on a background thread. All zero for the GPU arena.
struct PinningStats {
  uint64_t piece_bytes = 0;
  uint64_t pieces = 0;         // in the whole slab
  uint64_t pinned_pieces = 0;  // pinned with the device so far
  uint64_t pinned_bytes = 0;
  uint64_t unpinned_pieces = 0;  // in use, left unpinned after a failure (see warning())
  uint64_t pin_ns = 0;           // time spent pinning (register_host: cudaHostRegister)
  uint64_t listener_pieces = 0;  // pieces the listener has registered (returned from)
  uint64_t listener_ns = 0;      // time spent in the listener, on the background thread
};

struct TierStats {
  TierKind kind = TierKind::kGpu;
  ArenaStats arena;
  uint64_t compaction_copies = 0;  // copy operations issued by compaction (chunks count)
  PinningStats pinning;
};

class MemoryTier {
 public:
  // The GPU arena: one device allocation of `bytes` made now. A small part of it (1/64, at most
  // 64 MiB) is kept as the bounce buffer that lets compaction slide a block by less than its size.
  static absl::StatusOr<std::unique_ptr<MemoryTier>> create_gpu_arena(Device& device,
                                                                      uint64_t bytes,
                                                                      uint64_t alignment = 256);
  // The pinned CPU tier: one page-aligned host slab of `bytes`, reserved now and pinned with
  // the device in pieces of `piece_bytes` (0: 64 MiB) as allocate() first hands out bytes in
  // each (piece 0 at once). Blocks returned by allocate() lie in pinned pieces (unless pinning
  // failed, see pinning_warning()).
  static absl::StatusOr<std::unique_ptr<MemoryTier>> create_pinned_cpu(Device& device,
                                                                       uint64_t bytes,
                                                                       uint64_t piece_bytes = 0);

  struct Region;
  class Key {  // passkey: only the factories above construct tiers
    friend class MemoryTier;
    Key() = default;
  };
  MemoryTier(Key, TierKind kind, Device& device, std::unique_ptr<Region> region, Arena arena);
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;
  ~MemoryTier();

  TierKind kind() const { return kind_; }
  uint64_t capacity() const;
  // The whole managed region [base, base + capacity()): for registering the pinned CPU tier
  // with io_uring. Addresses inside it belong to blocks; use address() for those.
  void* base() const;
  // The CPU tier's pinning pieces: piece i is [base + i * piece_bytes(), + piece_bytes()),
  // the last one possibly shorter. 0 for the GPU arena.
  uint64_t piece_bytes() const;
  // Called (on a background thread, once per piece, in first-use order) with each piece in use
  // now and each piece first used later: the runtime registers it with io_uring. Null
  // detaches, waiting for a call in progress; detach before what the listener uses goes away.
  void set_piece_listener(absl::AnyInvocable<void(uint32_t piece)> listener);
  // Blocks until the listener has returned for every piece in use now (Runtime's
  // wait_for_registration(); pieces first used while it waits may be waited for too).
  void wait_piece_listener() const;
  // A pinning failure after start (pieces left unpinned), or "".
  std::string pinning_warning() const;
  Device& device() const { return device_; }

  // Allocates `bytes`. When enough bytes are free but no hole is large enough, compacts (moving
  // only unpinned blocks) and retries; ResourceExhausted means the bytes are not there and the
  // caller must evict. `placement`: see Arena (kHigh for short-lived tensors).
  absl::StatusOr<BlockHandle> allocate(uint64_t bytes, Placement placement = Placement::kLow);
  absl::Status free(BlockHandle block);

  // The block's address, valid until compaction moves it: pin first to keep it.
  absl::StatusOr<void*> address(BlockHandle block) const;
  absl::Status pin(BlockHandle block);
  absl::Status unpin(BlockHandle block);

  // The latest compaction's copies, while still in flight; null when none are (always null for
  // the CPU tier).
  std::shared_ptr<Event> pending_compaction() const;
  // Makes later work on `stream` wait for compaction copies in flight; the host does not block.
  absl::Status order_after_compaction(Stream& stream) const;
  // Waits on the host for compaction copies in flight.
  absl::Status synchronize_compaction() const;

  TierStats stats() const;
  // Starts a new high-water mark (TierStats::arena.peak_used).
  void reset_peak();
  // Reservations of the arena's top for Placement::kHigh blocks (Arena::set_high_reserve); they
  // add up, and each is given back with the same count.
  void reserve_high(uint64_t bytes);
  void unreserve_high(uint64_t bytes);
  absl::Status check_invariants() const;

 private:
  absl::Status execute_moves(const CompactionPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status move_on_device(std::byte* dst, const std::byte* src, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TierKind kind_;
  Device& device_;
  const std::unique_ptr<Region> region_;
  mutable absl::Mutex mu_;
  Arena arena_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Stream> compaction_stream_ ABSL_GUARDED_BY(mu_);
  // Recorded after each compaction's copies; re-recorded by the next (same stream, so the latest
  // record covers every earlier compaction).
  std::shared_ptr<Event> compaction_done_ ABSL_GUARDED_BY(mu_);
  bool compacted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t high_reserved_ ABSL_GUARDED_BY(mu_) = 0;  // the sum; the arena holds at most capacity
  uint64_t compaction_copies_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata
