// Arena: allocation, free, handles, pins, statistics and the invariant checker.
// Compaction planning and commit live in compaction.cc.
#include "strata/allocator/arena.h"

#include <absl/strings/str_cat.h>

#include <bit>
#include <cassert>
#include <utility>

namespace strata {

namespace {

// Offsets stay below 2^62 so that aligning them up can never overflow.
constexpr uint64_t kMaxCapacity = uint64_t{1} << 62;

// Best-fit candidates examined before falling back to a block that fits whatever its offset.
constexpr int kAlignedCandidates = 8;

}  // namespace

absl::StatusOr<Arena> Arena::create(uint64_t capacity, uint64_t alignment) {
  if (!std::has_single_bit(alignment)) {
    return absl::InvalidArgumentError(absl::StrCat("arena alignment ", alignment,
                                                   " is not a power of two; use e.g. 256 or 4096"));
  }
  if (capacity == 0 || capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena capacity ", capacity, " is out of range: it must be in [1, 2^62]"));
  }
  if (capacity % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena capacity ", capacity, " is not a multiple of its alignment ", alignment, "; use ",
        capacity < alignment ? "" : absl::StrCat(capacity / alignment * alignment, " or "),
        align_up(capacity, alignment)));
  }
  return Arena(capacity, alignment);
}

Arena::Arena(uint64_t capacity, uint64_t granularity)
    : capacity_(capacity), granularity_(granularity) {
  head_ = new_node();
  nodes_[head_].offset = 0;
  nodes_[head_].size = capacity;
  nodes_[head_].state = State::kFree;
  insert_free(head_);
  counters_.capacity = capacity;
}

// ---- node slots, free index and block list ----

uint32_t Arena::new_node() {
  if (!unused_slots_.empty()) {
    uint32_t n = unused_slots_.back();
    unused_slots_.pop_back();
    return n;
  }
  nodes_.emplace_back();
  return static_cast<uint32_t>(nodes_.size() - 1);
}

void Arena::release_node(uint32_t n) {
  Node& node = nodes_[n];
  node.state = State::kUnused;
  node.prev = node.next = kNone;
  node.pins = 0;
  unused_slots_.push_back(n);
}

void Arena::insert_free(uint32_t n) {
  free_index_.insert(FreeKey{nodes_[n].size, nodes_[n].offset, n});
}

void Arena::erase_free(uint32_t n) {
  [[maybe_unused]] size_t erased = free_index_.erase(FreeKey{nodes_[n].size, nodes_[n].offset, n});
  assert(erased == 1);
}

void Arena::unlink(uint32_t n) {
  Node& node = nodes_[n];
  if (node.prev != kNone) nodes_[node.prev].next = node.next;
  if (node.next != kNone) nodes_[node.next].prev = node.prev;
  if (head_ == n) head_ = node.next;
  release_node(n);
}

void Arena::link_after(uint32_t prev, uint32_t n) {
  Node& node = nodes_[n];
  node.prev = prev;
  node.next = nodes_[prev].next;
  if (node.next != kNone) nodes_[node.next].prev = n;
  nodes_[prev].next = n;
}

// ---- allocation ----

absl::StatusOr<Arena::Request> Arena::normalize(uint64_t bytes, uint64_t alignment) const {
  if (bytes == 0) {
    return absl::InvalidArgumentError("cannot allocate 0 bytes: request at least 1 byte");
  }
  if (alignment != 0 && !std::has_single_bit(alignment)) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocation alignment ", alignment, " is not a power of two"));
  }
  if (alignment > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("allocation alignment ", alignment,
                                                   " exceeds the arena capacity ", capacity_));
  }
  if (bytes > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes: larger than the arena's whole capacity of ", capacity_,
        " bytes; compaction cannot help, use a larger arena"));
  }
  return Request{align_up(bytes, granularity_), std::max(alignment, granularity_)};
}

uint32_t Arena::find_fit(const Request& req) const {
  auto fits = [&](const FreeKey& k) {
    return align_up(k.offset, req.alignment) - k.offset + req.bytes <= k.size;
  };
  auto it = free_index_.lower_bound(FreeKey{req.bytes, 0, 0});
  if (req.alignment == granularity_) return it == free_index_.end() ? kNone : it->node;
  // Over-aligned: the few best-fit candidates first, then the smallest block that fits at any
  // offset (padding is at most alignment - granularity), both O(log n).
  auto candidate = it;
  for (int i = 0; i < kAlignedCandidates && candidate != free_index_.end(); ++i, ++candidate) {
    if (fits(*candidate)) return candidate->node;
  }
  auto sure = free_index_.lower_bound(FreeKey{req.bytes + req.alignment - granularity_, 0, 0});
  if (sure != free_index_.end()) return sure->node;
  // Only blocks in [bytes, bytes + alignment - granularity) are left; look at all of them
  // before reporting failure so that allocate() never fails while a fitting hole exists.
  for (; candidate != free_index_.end(); ++candidate) {
    if (fits(*candidate)) return candidate->node;
  }
  return kNone;
}

uint32_t Arena::find_fit_high(const Request& req) const {
  // Every hole that could fit, highest offset wins: O(holes of at least `bytes`). Only
  // short-lived blocks ask for this, and their holes are few.
  uint32_t best = kNone;
  uint64_t best_offset = 0;
  for (auto it = free_index_.lower_bound(FreeKey{req.bytes, 0, 0}); it != free_index_.end(); ++it) {
    const uint64_t top = align_down(it->offset + it->size - req.bytes, req.alignment);
    if (top >= it->offset && (best == kNone || it->offset > best_offset)) {
      best = it->node;
      best_offset = it->offset;
    }
  }
  return best;
}

uint32_t Arena::find_fit_below(const Request& req, uint64_t limit) const {
  // Smallest first (best-fit), so the first hole whose placement ends by `limit` is the one.
  for (auto it = free_index_.lower_bound(FreeKey{req.bytes, 0, 0}); it != free_index_.end(); ++it) {
    const uint64_t start = align_up(it->offset, req.alignment);
    if (start + req.bytes <= it->offset + it->size && start + req.bytes <= limit) return it->node;
  }
  return kNone;
}

uint32_t Arena::find(const Request& req, Placement placement) const {
  if (placement == Placement::kHigh) return find_fit_high(req);
  if (high_reserve_ == 0) return find_fit(req);
  const uint32_t below = find_fit_below(req, capacity_ - high_reserve_);
  if (below != kNone || placement == Placement::kLow) return below;
  return find_fit(req);
}

BlockHandle Arena::carve(uint32_t f, const Request& req, Placement placement) {
  erase_free(f);
  const uint64_t start = nodes_[f].offset;
  const uint64_t end = start + nodes_[f].size;
  const uint64_t aligned = placement == Placement::kHigh
                               ? align_down(end - req.bytes, req.alignment)
                               : align_up(start, req.alignment);
  assert(aligned >= start);
  assert(aligned + req.bytes <= end);

  uint32_t live = f;
  if (aligned != start) {
    // The alignment padding stays a free block in front; its predecessor is live, so the
    // no-adjacent-free-blocks invariant holds.
    live = new_node();
    nodes_[f].size = aligned - start;
    insert_free(f);
    link_after(f, live);
  }
  Node& node = nodes_[live];
  node.offset = aligned;
  node.size = req.bytes;
  node.state = State::kLive;
  node.pins = 0;
  node.align_log2 = static_cast<uint8_t>(std::countr_zero(req.alignment));
  ++node.generation;
  if (aligned + req.bytes != end) {
    uint32_t tail = new_node();
    nodes_[tail].offset = aligned + req.bytes;
    nodes_[tail].size = end - (aligned + req.bytes);
    nodes_[tail].state = State::kFree;
    link_after(live, tail);
    insert_free(tail);
  }
  used_ += req.bytes;
  counters_.peak_used = std::max(counters_.peak_used, used_);
  ++counters_.allocations;
  ++epoch_;
  return BlockHandle{live, nodes_[live].generation};
}

absl::Status Arena::exhausted(const Request& req) const {
  const uint64_t free = capacity_ - used_;
  const uint64_t largest = free_index_.empty() ? 0 : free_index_.rbegin()->size;
  std::string verdict;
  if (absl::StatusOr<CompactionPlan> plan = plan_compaction(req.bytes, req.alignment); plan.ok()) {
    verdict = absl::StrCat("compaction can make room by moving ", plan->bytes_moved,
                           " bytes (use allocate_compacting)");
  } else {
    verdict = absl::StrCat("compaction cannot help: ", plan.status().message());
  }
  std::string reserve;
  if (high_reserve_ > 0) {
    reserve = absl::StrCat("; the top ", high_reserve_,
                           " bytes are reserved for short-lived blocks (set_high_reserve)");
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot allocate ", req.bytes, " bytes (alignment ", req.alignment, "): ", free,
                   " of ", capacity_, " bytes are free but the largest hole is ", largest,
                   " bytes; ", verdict, reserve));
}

absl::StatusOr<BlockHandle> Arena::allocate(uint64_t bytes, uint64_t alignment,
                                            Placement placement) {
  absl::StatusOr<Request> req = normalize(bytes, alignment);
  if (!req.ok()) {
    if (absl::IsResourceExhausted(req.status())) ++counters_.failures;
    return req.status();
  }
  uint32_t f = find(*req, placement);
  if (f == kNone) {
    ++counters_.failures;
    return exhausted(*req);
  }
  return carve(f, *req, placement);
}

// ---- handles, free, pins ----

absl::StatusOr<uint32_t> Arena::live_node(BlockHandle block) const {
  if (!block.valid()) {
    return absl::InvalidArgumentError("invalid (default-constructed) block handle");
  }
  if (block.index >= nodes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block handle index ", block.index, " was never issued by this arena"));
  }
  const Node& node = nodes_[block.index];
  if (node.state != State::kLive || node.generation != block.generation) {
    return absl::NotFoundError(
        absl::StrCat("block handle {", block.index, ", generation ", block.generation,
                     "} is stale: its block was already freed (double free or use after free)"));
  }
  return block.index;
}

bool Arena::contains(BlockHandle block) const { return live_node(block).ok(); }

uint64_t Arena::offset(BlockHandle block) const {
  assert(contains(block));
  return nodes_[block.index].offset;
}

uint64_t Arena::size(BlockHandle block) const {
  assert(contains(block));
  return nodes_[block.index].size;
}

absl::StatusOr<uint64_t> Arena::checked_offset(BlockHandle block) const {
  absl::StatusOr<uint32_t> n = live_node(block);
  if (!n.ok()) return n.status();
  return nodes_[*n].offset;
}

absl::Status Arena::free(BlockHandle block) {
  absl::StatusOr<uint32_t> found = live_node(block);
  if (!found.ok()) return found.status();
  uint32_t n = *found;
  if (nodes_[n].pins != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot free the block at offset ",
                                                      nodes_[n].offset, ": it is pinned ",
                                                      nodes_[n].pins, " time(s); unpin it first"));
  }
  used_ -= nodes_[n].size;
  nodes_[n].state = State::kFree;
  // Immediate coalescing: merge into a free predecessor, then absorb a free successor.
  if (uint32_t p = nodes_[n].prev; p != kNone && nodes_[p].state == State::kFree) {
    erase_free(p);
    nodes_[p].size += nodes_[n].size;
    unlink(n);
    n = p;
  }
  if (uint32_t s = nodes_[n].next; s != kNone && nodes_[s].state == State::kFree) {
    erase_free(s);
    nodes_[n].size += nodes_[s].size;
    unlink(s);
  }
  insert_free(n);
  ++counters_.frees;
  ++epoch_;
  return absl::OkStatus();
}

absl::Status Arena::pin(BlockHandle block) {
  absl::StatusOr<uint32_t> n = live_node(block);
  if (!n.ok()) return n.status();
  ++nodes_[*n].pins;
  ++epoch_;  // a plan made before may move this block
  return absl::OkStatus();
}

absl::Status Arena::unpin(BlockHandle block) {
  absl::StatusOr<uint32_t> n = live_node(block);
  if (!n.ok()) return n.status();
  if (nodes_[*n].pins == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot unpin the block at offset ", nodes_[*n].offset, ": it is not pinned"));
  }
  --nodes_[*n].pins;
  ++epoch_;
  return absl::OkStatus();
}

bool Arena::is_pinned(BlockHandle block) const {
  absl::StatusOr<uint32_t> n = live_node(block);
  return n.ok() && nodes_[*n].pins != 0;
}

// ---- introspection ----

void Arena::reset_peak() { counters_.peak_used = used_; }

ArenaStats Arena::stats() const {
  ArenaStats s = counters_;
  s.granularity = granularity_;
  s.used = used_;
  s.free = capacity_ - used_;
  s.largest_free = free_index_.empty() ? 0 : free_index_.rbegin()->size;
  s.fragmentation =
      s.free == 0 ? 0.0 : 1.0 - static_cast<double>(s.largest_free) / static_cast<double>(s.free);
  s.live_blocks = nodes_.size() - unused_slots_.size() - free_index_.size();
  return s;
}

void Arena::for_each_block(absl::FunctionRef<void(const BlockInfo&)> visit) const {
  for (uint32_t n = head_; n != kNone; n = nodes_[n].next) {
    const Node& node = nodes_[n];
    if (node.state != State::kLive) continue;
    visit(BlockInfo{BlockHandle{n, node.generation}, node.offset, node.size,
                    uint64_t{1} << node.align_log2, node.pins});
  }
}

absl::Status Arena::check_invariants() const {
  auto fail = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("arena invariant violated: ", parts...));
  };
  uint64_t cursor = 0, used = 0, free_blocks = 0, listed = 0;
  uint32_t prev = kNone;
  bool prev_free = false;
  for (uint32_t n = head_; n != kNone; prev = n, n = nodes_[n].next) {
    if (n >= nodes_.size()) return fail("list link to node ", n, " out of range");
    if (++listed > nodes_.size()) return fail("block list has a cycle");
    const Node& node = nodes_[n];
    if (node.prev != prev) return fail("node ", n, " has prev ", node.prev, ", expected ", prev);
    if (node.state == State::kUnused) return fail("unused node ", n, " is in the block list");
    if (node.offset != cursor) {
      return fail("block at ", node.offset, " should start at ", cursor, " (gap or overlap)");
    }
    if (node.size == 0 || node.offset % granularity_ != 0 || node.size % granularity_ != 0) {
      return fail("block [", node.offset, ", +", node.size, ") is empty or not aligned to ",
                  granularity_);
    }
    const bool is_free = node.state == State::kFree;
    if (is_free) {
      if (prev_free) return fail("adjacent free blocks at ", node.offset, " (not coalesced)");
      if (!free_index_.contains(FreeKey{node.size, node.offset, n})) {
        return fail("free block at ", node.offset, " is missing from the free index");
      }
      if (node.pins != 0) return fail("free block at ", node.offset, " is pinned");
      ++free_blocks;
    } else {
      if (node.offset % (uint64_t{1} << node.align_log2) != 0) {
        return fail("live block at ", node.offset, " breaks its alignment 2^", node.align_log2);
      }
      used += node.size;
    }
    prev_free = is_free;
    cursor += node.size;
  }
  if (cursor != capacity_) return fail("blocks cover ", cursor, " of ", capacity_, " bytes");
  if (head_ != kNone && nodes_[head_].offset != 0) return fail("head is not at offset 0");
  if (used != used_) return fail("live blocks sum to ", used, " bytes, counter says ", used_);
  if (free_blocks != free_index_.size()) {
    return fail("free index holds ", free_index_.size(), " entries for ", free_blocks,
                " free blocks");
  }
  for (const FreeKey& k : free_index_) {
    if (k.node >= nodes_.size() || nodes_[k.node].state != State::kFree ||
        nodes_[k.node].offset != k.offset || nodes_[k.node].size != k.size) {
      return fail("free index entry {", k.size, ", ", k.offset, "} does not match its node");
    }
  }
  uint64_t unused = 0;
  for (const Node& node : nodes_) unused += node.state == State::kUnused;
  if (unused != unused_slots_.size() || listed + unused != nodes_.size()) {
    return fail("slot table: ", unused, " unused nodes, ", unused_slots_.size(),
                " on the free-slot list, ", listed, " listed of ", nodes_.size());
  }
  for (uint32_t n : unused_slots_) {
    if (n >= nodes_.size() || nodes_[n].state != State::kUnused) {
      return fail("free-slot list names node ", n, " which is in use");
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
