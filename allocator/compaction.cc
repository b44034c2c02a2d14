// Arena compaction: planning which blocks slide down, committing the owner's moves, and
// allocate_compacting() which ties the two around the owner's copy routine.
//
// Planning view: pinned blocks and the arena ends split the address space into segments. Inside
// a segment, free gaps G0..Gm alternate with runs of movable blocks. Sliding every block
// between gaps Gs and Ge down (each to the lowest offset its alignment allows) merges the gaps
// Gs..Ge into one hole that ends where Ge ended. Its cost is the bytes of the blocks slid; the
// hole is the sum of the gaps less alignment padding. Both grow with the window, so a two-pointer
// sweep finds, for each Ge, the narrowest window whose gaps add up to the request; a best-first
// search over those windows (cheapest first, widening a window downward when alignment padding
// makes it fall short) returns the cheapest window whose simulated hole fits.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cassert>
#include <optional>
#include <queue>

#include "strata/allocator/arena.h"

namespace strata {

namespace {

struct Window {
  uint64_t cost;  // bytes of movable blocks between the two gaps
  size_t first_gap;
  size_t last_gap;
  friend bool operator>(const Window& a, const Window& b) {
    return a.cost != b.cost ? a.cost > b.cost : a.last_gap - a.first_gap > b.last_gap - b.first_gap;
  }
};

}  // namespace

absl::StatusOr<CompactionPlan> Arena::plan_compaction(uint64_t bytes, uint64_t alignment) const {
  absl::StatusOr<Request> normalized = normalize(bytes, alignment);
  if (!normalized.ok()) return normalized.status();
  const Request req = *normalized;
  const uint64_t free = capacity_ - used_;
  if (free < req.bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("only ", free, " of ", capacity_, " bytes are free and ", req.bytes,
                     " are needed; free blocks (or evict to another tier) or use a larger arena"));
  }

  // Flatten the block list. `live_before[i]` = movable bytes in items [0, i).
  std::vector<uint32_t> items;
  std::vector<uint64_t> live_before{0};
  std::vector<size_t> gap_items;                        // item index of each free block
  std::vector<std::pair<size_t, size_t>> segment_gaps;  // [first, last) gap per segment
  size_t segment_start = 0;
  for (uint32_t n = head_; n != kNone; n = nodes_[n].next) {
    const Node& node = nodes_[n];
    const bool pinned = node.state == State::kLive && node.pins != 0;
    if (pinned) {
      segment_gaps.emplace_back(segment_start, gap_items.size());
      segment_start = gap_items.size();
    }
    if (node.state == State::kFree) gap_items.push_back(items.size());
    live_before.push_back(live_before.back() +
                          (node.state == State::kLive && !pinned ? node.size : 0));
    items.push_back(n);
  }
  segment_gaps.emplace_back(segment_start, gap_items.size());

  auto gap_node = [&](size_t g) -> const Node& { return nodes_[items[gap_items[g]]]; };
  auto cost = [&](size_t s, size_t e) {
    return live_before[gap_items[e]] - live_before[gap_items[s] + 1];
  };
  // Slides the blocks between gaps s and e down; returns where the merged hole starts.
  auto simulate = [&](size_t s, size_t e, std::vector<CompactionMove>* moves) {
    uint64_t cursor = gap_node(s).offset;
    for (size_t i = gap_items[s] + 1; i < gap_items[e]; ++i) {
      const Node& node = nodes_[items[i]];
      if (node.state != State::kLive) continue;
      const uint64_t to = align_up(cursor, uint64_t{1} << node.align_log2);
      assert(to <= node.offset);
      if (moves != nullptr && to != node.offset) {
        moves->push_back(
            CompactionMove{BlockHandle{items[i], node.generation}, node.offset, to, node.size});
      }
      cursor = to + node.size;
    }
    return cursor;
  };
  auto hole_end = [&](size_t e) { return gap_node(e).offset + gap_node(e).size; };
  auto fits = [&](uint64_t hole_start, uint64_t end) {
    return align_up(hole_start, req.alignment) + req.bytes <= end;
  };

  // Candidate windows: per last gap e, the narrowest window whose gaps sum to the request.
  std::priority_queue<Window, std::vector<Window>, std::greater<>> candidates;
  for (auto [first, last] : segment_gaps) {
    uint64_t gap_sum = 0;  // bytes of gaps s..e
    for (size_t s = first, e = first; e < last; ++e) {
      gap_sum += gap_node(e).size;
      while (s < e && gap_sum - gap_node(s).size >= req.bytes) gap_sum -= gap_node(s++).size;
      if (gap_sum >= req.bytes) candidates.push(Window{cost(s, e), s, e});
    }
  }
  // The first gap of each window's segment, to know how far a window may widen.
  auto segment_first = [&](size_t g) {
    auto it = std::upper_bound(segment_gaps.begin(), segment_gaps.end(), g,
                               [](size_t v, const auto& seg) { return v < seg.second; });
    return it->first;
  };
  while (!candidates.empty()) {
    Window w = candidates.top();
    candidates.pop();
    if (fits(simulate(w.first_gap, w.last_gap, nullptr), hole_end(w.last_gap))) {
      CompactionPlan plan;
      plan.epoch = epoch_;
      plan.hole_offset = simulate(w.first_gap, w.last_gap, &plan.moves);
      plan.hole_bytes = hole_end(w.last_gap) - plan.hole_offset;
      for (const CompactionMove& m : plan.moves) plan.bytes_moved += m.bytes;
      return plan;
    }
    if (w.first_gap > segment_first(w.first_gap)) {
      candidates.push(Window{cost(w.first_gap - 1, w.last_gap), w.first_gap - 1, w.last_gap});
    }
  }

  uint64_t best = 0;  // the largest hole any segment can be compacted into
  for (auto [first, last] : segment_gaps) {
    if (first == last) continue;
    best = std::max(best, hole_end(last - 1) - simulate(first, last - 1, nullptr));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("with every unpinned block slid down, the largest hole is ", best,
                   " bytes, and ", req.bytes, " (alignment ", req.alignment,
                   ") are needed: pinned blocks or alignment "
                   "padding split the ",
                   free, " free bytes; unpin blocks or free more"));
}

absl::Status Arena::commit_compaction(const CompactionPlan& plan) {
  if (plan.epoch != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "compaction plan was made for arena version ", plan.epoch, " but the arena is at version ",
        epoch_,
        ": it was changed (allocate, free, pin, unpin or another commit) between "
        "plan_compaction and commit_compaction; do not change the arena while executing a plan"));
  }
  if (plan.moves.empty()) return absl::OkStatus();

  auto bad_plan = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("malformed compaction plan: ", parts...));
  };
  for (const CompactionMove& m : plan.moves) {
    absl::StatusOr<uint32_t> n = live_node(m.block);
    if (!n.ok()) return bad_plan(n.status().message());
    const Node& node = nodes_[*n];
    if (node.offset != m.from || node.size != m.bytes || m.to >= m.from ||
        m.to % (uint64_t{1} << node.align_log2) != 0 || node.pins != 0) {
      return bad_plan("move of the block at ", node.offset, " (", m.from, " -> ", m.to, ", ",
                      m.bytes, " bytes) does not match an unpinned block sliding down");
    }
  }
  const uint64_t hole_end = plan.hole_offset + plan.hole_bytes;
  if (plan.hole_bytes == 0 || hole_end > capacity_) {
    return bad_plan("hole [", plan.hole_offset, ", ", hole_end, ") is outside the arena");
  }

  // The affected range runs from the block holding the first destination to the one holding
  // the end of the hole.
  std::vector<uint32_t> range;
  uint32_t first = plan.moves.front().block.index;
  while (nodes_[first].offset > plan.moves.front().to) first = nodes_[first].prev;
  for (uint32_t n = first;; n = nodes_[n].next) {
    if (n == kNone) return bad_plan("hole ends past the last block");
    range.push_back(n);
    if (nodes_[n].offset + nodes_[n].size >= hole_end) break;
  }
  const uint64_t range_start = nodes_[first].offset;
  const uint64_t range_end = nodes_[range.back()].offset + nodes_[range.back()].size;

  // Check the new layout before touching anything: moves in address order, none overlapping.
  std::vector<std::pair<uint32_t, uint64_t>> live;  // node, new offset
  size_t next_move = 0;
  uint64_t cursor = range_start;
  for (uint32_t n : range) {
    if (nodes_[n].state != State::kLive) continue;
    uint64_t to = nodes_[n].offset;
    if (next_move < plan.moves.size() && plan.moves[next_move].block.index == n) {
      to = plan.moves[next_move++].to;
    }
    if (to < cursor) return bad_plan("the block moved to ", to, " overlaps its predecessor");
    live.emplace_back(n, to);
    cursor = to + nodes_[n].size;
  }
  if (next_move != plan.moves.size() || cursor > plan.hole_offset) {
    return bad_plan("moves are out of address order or overlap the hole");
  }

  // Rebuild the range: live blocks at their new offsets, free blocks in the gaps between them.
  const uint32_t before = nodes_[first].prev;
  const uint32_t after = nodes_[range.back()].next;
  for (uint32_t n : range) {
    if (nodes_[n].state == State::kFree) {
      erase_free(n);
      release_node(n);
    }
  }
  uint32_t tail = before;
  auto append = [&](uint32_t n) {
    nodes_[n].prev = tail;
    (tail == kNone ? head_ : nodes_[tail].next) = n;
    tail = n;
  };
  auto append_free = [&](uint64_t from, uint64_t to) {
    uint32_t f = new_node();
    nodes_[f].offset = from;
    nodes_[f].size = to - from;
    nodes_[f].state = State::kFree;
    append(f);
    insert_free(f);
  };
  cursor = range_start;
  for (auto [n, to] : live) {
    if (to > cursor) append_free(cursor, to);
    nodes_[n].offset = to;
    append(n);
    cursor = to + nodes_[n].size;
  }
  if (range_end > cursor) append_free(cursor, range_end);
  nodes_[tail].next = after;
  if (after != kNone) nodes_[after].prev = tail;

  ++counters_.compactions;
  counters_.bytes_moved += plan.bytes_moved;
  ++epoch_;
  return absl::OkStatus();
}

absl::StatusOr<BlockHandle> Arena::allocate_compacting(
    uint64_t bytes, uint64_t alignment,
    absl::FunctionRef<absl::Status(const CompactionPlan&)> execute_moves, Placement placement) {
  absl::StatusOr<Request> req = normalize(bytes, alignment);
  if (!req.ok()) {
    if (absl::IsResourceExhausted(req.status())) ++counters_.failures;
    return req.status();
  }
  if (uint32_t f = find(*req, placement); f != kNone) return carve(f, *req, placement);

  absl::StatusOr<CompactionPlan> plan = plan_compaction(req->bytes, req->alignment);
  const bool crosses_reserve =
      plan.ok() && placement == Placement::kLow && high_reserve_ > 0 &&
      align_up(plan->hole_offset, req->alignment) + req->bytes > capacity_ - high_reserve_;
  if (!plan.ok() || crosses_reserve) {
    ++counters_.failures;
    return exhausted(*req);
  }
  if (absl::Status moved = execute_moves(*plan); !moved.ok()) {
    ++counters_.failures;
    return absl::Status(moved.code(),
                        absl::StrCat("compaction to allocate ", req->bytes,
                                     " bytes failed while moving blocks (the arena is unchanged: "
                                     "it still records every block at its old offset): ",
                                     moved.message()));
  }
  if (absl::Status committed = commit_compaction(*plan); !committed.ok()) return committed;
  auto hole = free_index_.find(FreeKey{plan->hole_bytes, plan->hole_offset, 0});
  assert(hole != free_index_.end());
  return carve(hole->node, *req, placement);
}

}  // namespace strata
