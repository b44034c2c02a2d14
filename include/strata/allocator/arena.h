// strata::Arena — an offset allocator over one contiguous region [0, capacity).
//
// The GPU arena, the pinned CPU tier and the NVMe swap space each hand out ranges of one big
// preallocated region through an Arena. It knows nothing of what the bytes are: it only tracks
// offsets, so all metadata lives here, outside the (possibly device) memory.
//
// Allocation is best-fit over a size-ordered B-tree of free blocks, with an address-ordered
// doubly linked block list for O(1) coalescing; see docs/allocator.md for why and for figures.
// A request may ask for the high end instead (Placement::kHigh): the fitting hole with the highest
// offset, the block at its top. Short-lived blocks placed there (activations between forward and
// backward) keep away from long-lived ones, so that pinned long-lived blocks do not end up spread
// among the holes the short-lived ones leave (docs/allocator.md, "Placement").
// Blocks are named by stable handles (slot index + generation): a handle stays valid while its
// block moves during compaction, and a stale or forged handle is detected, never dereferenced.
//
// Compaction is split so that the owner, who can copy bytes, stays in charge of the copies:
//   plan_compaction() -> owner executes the moves (memmove semantics, in order) ->
//   commit_compaction(). allocate_compacting() wraps the three steps.
//
// Not thread-safe: the owner serialises calls. Move-only.
#pragma once

#include <absl/container/btree_set.h>
#include <absl/functional/function_ref.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace strata {

// Where in the arena a block goes. kLow: best-fit (the smallest hole that fits, the block at its
// low end) below the high reserve, if one is set (set_high_reserve). kHigh: the highest hole
// that fits, the block at its top. kAnywhere: kLow when a hole below the reserve fits, else
// best-fit over the whole arena (a last resort that may split the reserve).
enum class Placement : uint8_t { kLow, kHigh, kAnywhere };

struct BlockHandle {
  uint32_t index = UINT32_MAX;
  uint32_t generation = 0;

  bool valid() const { return index != UINT32_MAX; }
  friend bool operator==(const BlockHandle&, const BlockHandle&) = default;
};

struct ArenaStats {
  uint64_t capacity = 0;
  uint64_t granularity = 0;   // every block size and offset is a multiple of it
  uint64_t used = 0;          // bytes in live blocks (sizes rounded up to the granularity)
  uint64_t free = 0;          // capacity - used
  uint64_t largest_free = 0;  // largest free block
  uint64_t peak_used = 0;
  double fragmentation = 0;  // 1 - largest_free / free; 0 when free == 0
  uint64_t live_blocks = 0;
  uint64_t allocations = 0;  // successful allocations
  uint64_t frees = 0;        // successful frees
  uint64_t failures = 0;     // requests that ended in ResourceExhausted
  uint64_t compactions = 0;  // committed non-empty compaction plans
  uint64_t bytes_moved = 0;  // by committed compactions
};

// Move `bytes` of `block` from offset `from` down to `to` (< from). Source and destination may
// overlap, so the executor must copy with memmove semantics.
struct CompactionMove {
  BlockHandle block;
  uint64_t from = 0;
  uint64_t to = 0;
  uint64_t bytes = 0;
};

// Moves to execute in vector order; afterwards [hole_offset, hole_offset + hole_bytes) is free
// and holds the request the plan was made for (after aligning hole_offset up).
struct CompactionPlan {
  std::vector<CompactionMove> moves;
  uint64_t bytes_moved = 0;
  uint64_t epoch = 0;  // arena version the plan is valid for
  uint64_t hole_offset = 0;
  uint64_t hole_bytes = 0;
};

// A live block, as seen by for_each_block().
struct BlockInfo {
  BlockHandle handle;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t alignment = 0;
  uint32_t pins = 0;
};

class Arena {
 public:
  // `alignment` is the granularity: a power of two that divides every offset and block size
  // (256 for GPU memory, 4096 for pinned host memory and NVMe). `capacity` must be a positive
  // multiple of it.
  static absl::StatusOr<Arena> create(uint64_t capacity, uint64_t alignment = 256);

  Arena(Arena&&) noexcept = default;
  Arena& operator=(Arena&&) noexcept = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `bytes` is rounded up to the granularity. `alignment` 0 means the granularity; otherwise a
  // power of two (values below the granularity are raised to it). Errors: InvalidArgument for
  // zero bytes or a bad alignment; ResourceExhausted when no free block fits, with a message
  // that says whether compaction could make room.
  absl::StatusOr<BlockHandle> allocate(uint64_t bytes, uint64_t alignment = 0,
                                       Placement placement = Placement::kLow);

  // Like allocate(), but when free space exists and is fragmented: plans a compaction, calls
  // `execute_moves` to copy the bytes, commits and retries. If `execute_moves` fails the arena
  // is unchanged and its status is returned, so `execute_moves` must fail before it copies
  // anything (a block may slide over its own old bytes: a half-executed plan cannot be undone).
  absl::StatusOr<BlockHandle> allocate_compacting(
      uint64_t bytes, uint64_t alignment,
      absl::FunctionRef<absl::Status(const CompactionPlan&)> execute_moves,
      Placement placement = Placement::kLow);

  // InvalidArgument for a handle this arena never issued, NotFound for a stale handle (double
  // free), FailedPrecondition for a pinned block.
  absl::Status free(BlockHandle block);

  bool contains(BlockHandle block) const;
  // Debug-asserts that `block` is live; use checked_offset() where that is not known.
  uint64_t offset(BlockHandle block) const;
  uint64_t size(BlockHandle block) const;
  absl::StatusOr<uint64_t> checked_offset(BlockHandle block) const;

  // Pinned blocks never move and cannot be freed. Pins nest: unpin once per pin.
  absl::Status pin(BlockHandle block);
  absl::Status unpin(BlockHandle block);
  bool is_pinned(BlockHandle block) const;

  // Plans moves (unpinned blocks slide toward lower offsets) that leave a free hole for
  // `bytes` at `alignment`, moving as few bytes as it can find. ResourceExhausted when no plan
  // exists: too few free bytes, or pinned blocks split the free space. An empty plan means a
  // fitting hole exists already.
  absl::StatusOr<CompactionPlan> plan_compaction(uint64_t bytes, uint64_t alignment = 0) const;

  // Records that the owner executed every move of `plan`. FailedPrecondition if the arena
  // changed (allocate, free, pin, unpin, commit) since the plan was made.
  absl::Status commit_compaction(const CompactionPlan& plan);

  // Keeps the top `bytes` for kHigh requests: kLow requests stay below them (and fail when only
  // the reserve has room), kAnywhere requests go there only when nothing below fits. Its owner
  // (the store, for ActivationStash's window) thereby keeps room for short-lived blocks at the
  // top that long-lived pinned blocks do not split.
  void set_high_reserve(uint64_t bytes) { high_reserve_ = std::min(bytes, capacity_); }
  uint64_t high_reserve() const { return high_reserve_; }

  ArenaStats stats() const;
  // Starts a new high-water mark: peak_used becomes the bytes in use now.
  void reset_peak();

  // Walks every structure and reports the first inconsistency. For tests and debug builds.
  absl::Status check_invariants() const;

  // Visits live blocks in address order.
  void for_each_block(absl::FunctionRef<void(const BlockInfo&)> visit) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return granularity_; }
  uint64_t epoch() const { return epoch_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  enum class State : uint8_t { kUnused, kFree, kLive };

  // One block (free or live) in the address-ordered list, or an unused slot.
  struct Node {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t prev = kNone;
    uint32_t next = kNone;
    uint32_t generation = 0;  // bumped each time the slot becomes live
    uint32_t pins = 0;
    uint8_t align_log2 = 0;  // the block's own alignment, kept for compaction planning
    State state = State::kUnused;
  };

  // Free-block index, best fit first: smallest size, then lowest offset.
  struct FreeKey {
    uint64_t size;
    uint64_t offset;
    uint32_t node;
    friend bool operator<(const FreeKey& a, const FreeKey& b) {
      return a.size != b.size ? a.size < b.size : a.offset < b.offset;
    }
  };

  // A validated request: size rounded to the granularity, alignment resolved.
  struct Request {
    uint64_t bytes;
    uint64_t alignment;
  };

  Arena(uint64_t capacity, uint64_t granularity);

  // `a` is a power of two; callers keep `v` below 2^63 so this cannot overflow.
  static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }
  static uint64_t align_down(uint64_t v, uint64_t a) { return v & ~(a - 1); }

  absl::StatusOr<Request> normalize(uint64_t bytes, uint64_t alignment) const;
  // Best-fit search; kNone when no free block fits.
  uint32_t find_fit(const Request& req) const;
  uint32_t find_fit_high(const Request& req) const;
  uint32_t find_fit_below(const Request& req, uint64_t limit) const;
  uint32_t find(const Request& req, Placement placement) const;
  // Carves a live block for `req` out of free node `f`, which must fit it.
  // Places the block in free block `f`: at its low end (aligned up) or its top (aligned down).
  BlockHandle carve(uint32_t f, const Request& req, Placement placement = Placement::kLow);
  absl::Status exhausted(const Request& req) const;
  // The live node behind `block`, or an error naming what is wrong with the handle.
  absl::StatusOr<uint32_t> live_node(BlockHandle block) const;

  uint32_t new_node();
  void release_node(uint32_t n);
  void insert_free(uint32_t n);
  void erase_free(uint32_t n);
  // Unlinks `n` from the block list and releases its slot.
  void unlink(uint32_t n);
  void link_after(uint32_t prev, uint32_t n);

  uint64_t capacity_ = 0;
  uint64_t high_reserve_ = 0;
  uint64_t granularity_ = 0;
  std::vector<Node> nodes_;
  std::vector<uint32_t> unused_slots_;
  absl::btree_set<FreeKey> free_index_;
  uint32_t head_ = kNone;  // node at offset 0
  uint64_t used_ = 0;
  uint64_t epoch_ = 0;
  ArenaStats counters_;  // the cumulative fields only; the rest is computed by stats()
};

}  // namespace strata
