// Arena: allocation, free, coalescing, handles, pins and statistics, including a randomized
// comparison against a reference model with the invariant checker run after every step.
#include "strata/allocator/arena.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <type_traits>
#include <vector>

namespace strata {
namespace {

Arena make_arena(uint64_t capacity, uint64_t alignment = 256) {
  absl::StatusOr<Arena> arena = Arena::create(capacity, alignment);
  REQUIRE(arena.ok());
  return std::move(*arena);
}

BlockHandle alloc(Arena& arena, uint64_t bytes, uint64_t alignment = 0) {
  absl::StatusOr<BlockHandle> h = arena.allocate(bytes, alignment);
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  return *h;
}

TEST_CASE("create rejects bad capacity and alignment, naming the value", "[arena]") {
  auto bad_alignment = Arena::create(4096, 100);
  REQUIRE(absl::IsInvalidArgument(bad_alignment.status()));
  CHECK_THAT(std::string(bad_alignment.status().message()), Catch::Contains("100"));
  CHECK(absl::IsInvalidArgument(Arena::create(4096, 0).status()));
  CHECK(absl::IsInvalidArgument(Arena::create(0, 256).status()));
  auto unaligned = Arena::create(1000, 256);
  REQUIRE(absl::IsInvalidArgument(unaligned.status()));
  CHECK_THAT(std::string(unaligned.status().message()), Catch::Contains("1000"));
  CHECK_THAT(std::string(unaligned.status().message()), Catch::Contains("768"));
  auto tiny = Arena::create(100, 256);
  REQUIRE(absl::IsInvalidArgument(tiny.status()));
  CHECK_THAT(std::string(tiny.status().message()), Catch::EndsWith("use 256"));
  CHECK(Arena::create(4096, 4096).ok());
}

TEST_CASE("a fresh arena is one free block", "[arena]") {
  Arena arena = make_arena(1 << 20);
  ArenaStats s = arena.stats();
  CHECK(s.capacity == 1 << 20);
  CHECK(s.free == 1 << 20);
  CHECK(s.largest_free == 1 << 20);
  CHECK(s.used == 0);
  CHECK(s.fragmentation == 0.0);
  CHECK(arena.check_invariants().ok());
}

TEST_CASE("sizes round up to the granularity and offsets honour alignment", "[arena]") {
  Arena arena = make_arena(1 << 20, 256);
  BlockHandle a = alloc(arena, 1);
  CHECK(arena.size(a) == 256);
  CHECK(arena.offset(a) == 0);
  BlockHandle b = alloc(arena, 300);
  CHECK(arena.size(b) == 512);
  CHECK(arena.offset(b) == 256);
  BlockHandle c = alloc(arena, 256, 4096);
  CHECK(arena.offset(c) % 4096 == 0);
  CHECK(arena.offset(c) == 4096);
  // The padding in front of c is a free block and is reused by a later fit.
  BlockHandle d = alloc(arena, 1024);
  CHECK(arena.offset(d) == 768);
  // Alignment below the granularity is raised to it.
  BlockHandle e = alloc(arena, 10, 8);
  CHECK(arena.offset(e) % 256 == 0);
  CHECK(arena.check_invariants().ok());
}

TEST_CASE("bad requests are errors, not crashes", "[arena]") {
  Arena arena = make_arena(4096, 256);
  CHECK(absl::IsInvalidArgument(arena.allocate(0).status()));
  auto odd = arena.allocate(256, 3000);
  CHECK(absl::IsInvalidArgument(odd.status()));
  CHECK_THAT(std::string(odd.status().message()), Catch::Contains("3000"));
  CHECK(absl::IsInvalidArgument(arena.allocate(256, 8192).status()));
  auto huge = arena.allocate(UINT64_MAX);
  REQUIRE(absl::IsResourceExhausted(huge.status()));
  CHECK_THAT(std::string(huge.status().message()), Catch::Contains("capacity"));
  CHECK(arena.stats().failures == 1);
  CHECK(arena.stats().allocations == 0);
  CHECK(arena.check_invariants().ok());
}

TEST_CASE("exhaustion says what was asked, what is free and whether compaction helps", "[arena]") {
  Arena arena = make_arena(4 * 256, 256);
  BlockHandle a = alloc(arena, 256);
  BlockHandle b = alloc(arena, 256);
  BlockHandle c = alloc(arena, 256);
  alloc(arena, 256);
  auto full = arena.allocate(256);
  REQUIRE(absl::IsResourceExhausted(full.status()));
  CHECK_THAT(std::string(full.status().message()), Catch::Contains("0 of 1024 bytes are free"));

  // Two 256-byte holes (at 0 and 512) but no 512-byte one.
  REQUIRE(arena.free(a).ok());
  REQUIRE(arena.free(c).ok());
  auto frag = arena.allocate(512);
  REQUIRE(absl::IsResourceExhausted(frag.status()));
  std::string msg(frag.status().message());
  CHECK_THAT(msg, Catch::Contains("512 bytes"));
  CHECK_THAT(msg, Catch::Contains("512 of 1024 bytes are free"));
  CHECK_THAT(msg, Catch::Contains("largest hole is 256"));
  CHECK_THAT(msg, Catch::Contains("compaction can make room"));

  REQUIRE(arena.pin(b).ok());  // the block at 256 now separates the holes
  auto pinned = arena.allocate(512);
  REQUIRE(absl::IsResourceExhausted(pinned.status()));
  CHECK_THAT(std::string(pinned.status().message()), Catch::Contains("compaction cannot help"));
  CHECK(arena.stats().failures == 3);
}

TEST_CASE("free coalesces with both neighbours immediately", "[arena]") {
  Arena arena = make_arena(8 * 256, 256);
  std::vector<BlockHandle> h;
  for (int i = 0; i < 8; ++i) h.push_back(alloc(arena, 256));
  REQUIRE(arena.free(h[2]).ok());
  REQUIRE(arena.free(h[4]).ok());
  CHECK(arena.stats().largest_free == 256);
  REQUIRE(arena.free(h[3]).ok());  // joins [2] and [4]
  CHECK(arena.stats().largest_free == 768);
  CHECK(arena.stats().fragmentation == 0.0);
  REQUIRE(arena.free(h[0]).ok());
  CHECK(arena.stats().fragmentation == Approx(1.0 - 768.0 / 1024.0));
  REQUIRE(arena.free(h[1]).ok());
  CHECK(arena.stats().largest_free == 5 * 256);
  for (int i = 5; i < 8; ++i) REQUIRE(arena.free(h[i]).ok());
  CHECK(arena.stats().largest_free == 8 * 256);
  CHECK(arena.check_invariants().ok());
  // One free block again: a full-size allocation succeeds.
  CHECK(arena.allocate(8 * 256).ok());
}

TEST_CASE("stale, forged and double-freed handles are detected", "[arena]") {
  Arena arena = make_arena(1 << 16);
  BlockHandle a = alloc(arena, 1000);
  REQUIRE(arena.free(a).ok());
  CHECK(!arena.contains(a));
  auto twice = arena.free(a);
  CHECK(absl::IsNotFound(twice));
  CHECK_THAT(std::string(twice.message()), Catch::Contains("double free"));
  // The slot is reused with a new generation: the old handle stays stale.
  BlockHandle b = alloc(arena, 1000);
  CHECK(b.index == a.index);
  CHECK(b.generation != a.generation);
  CHECK(!arena.contains(a));
  CHECK(absl::IsNotFound(arena.free(a)));
  CHECK(absl::IsNotFound(arena.checked_offset(a).status()));
  CHECK(absl::IsInvalidArgument(arena.free(BlockHandle{})));
  CHECK(absl::IsInvalidArgument(arena.free(BlockHandle{12345, 1})));
  CHECK(absl::IsNotFound(arena.pin(a)));
  CHECK(!arena.is_pinned(a));
  CHECK(arena.contains(b));
  CHECK(arena.checked_offset(b).value() == arena.offset(b));
  CHECK(arena.stats().frees == 1);
  CHECK(arena.check_invariants().ok());
}

TEST_CASE("pins nest and pinned blocks cannot be freed", "[arena]") {
  Arena arena = make_arena(1 << 16);
  BlockHandle a = alloc(arena, 4096);
  CHECK(!arena.is_pinned(a));
  REQUIRE(arena.pin(a).ok());
  REQUIRE(arena.pin(a).ok());
  CHECK(arena.is_pinned(a));
  CHECK(absl::IsFailedPrecondition(arena.free(a)));
  REQUIRE(arena.unpin(a).ok());
  CHECK(arena.is_pinned(a));
  CHECK(absl::IsFailedPrecondition(arena.free(a)));
  REQUIRE(arena.unpin(a).ok());
  CHECK(!arena.is_pinned(a));
  CHECK(absl::IsFailedPrecondition(arena.unpin(a)));
  CHECK(arena.free(a).ok());
}

TEST_CASE("best fit picks the smallest hole, lowest offset first", "[arena]") {
  Arena arena = make_arena(64 * 256, 256);
  // Holes of 3, 1, 2 and 1 units separated by live blocks.
  std::vector<BlockHandle> h;
  for (uint64_t units : {3, 1, 1, 1, 2, 1, 1, 1}) h.push_back(alloc(arena, units * 256));
  for (int i : {0, 2, 4, 6}) REQUIRE(arena.free(h[i]).ok());
  CHECK(arena.offset(alloc(arena, 256)) == 4 * 256);  // first 1-unit hole
  CHECK(arena.offset(alloc(arena, 256)) == 9 * 256);  // second 1-unit hole
  CHECK(arena.offset(alloc(arena, 300)) == 6 * 256);  // the 2-unit hole, not the 3-unit one
  CHECK(arena.check_invariants().ok());
}

TEST_CASE("move-only arena keeps its blocks when moved", "[arena]") {
  static_assert(!std::is_copy_constructible_v<Arena>);
  static_assert(std::is_nothrow_move_constructible_v<Arena>);
  Arena arena = make_arena(1 << 16);
  BlockHandle a = alloc(arena, 512);
  Arena moved = std::move(arena);
  CHECK(moved.contains(a));
  CHECK(moved.check_invariants().ok());
}

// ---- randomized comparison against a reference model ----

struct ModelBlock {
  BlockHandle handle;
  uint64_t size;
  uint64_t alignment;
  uint32_t pins = 0;
};

class Model {
 public:
  Model(uint64_t capacity, uint64_t granularity) : capacity_(capacity), granularity_(granularity) {}

  // Gaps as [offset, end).
  std::vector<std::pair<uint64_t, uint64_t>> gaps() const {
    std::vector<std::pair<uint64_t, uint64_t>> out;
    uint64_t cursor = 0;
    for (const auto& [off, b] : live) {
      if (off > cursor) out.emplace_back(cursor, off);
      cursor = off + b.size;
    }
    if (capacity_ > cursor) out.emplace_back(cursor, capacity_);
    return out;
  }
  bool any_gap_fits(uint64_t bytes, uint64_t alignment) const {
    for (auto [start, end] : gaps()) {
      uint64_t aligned = (start + alignment - 1) / alignment * alignment;
      if (aligned + bytes <= end) return true;
    }
    return false;
  }
  // The smallest gap that holds `bytes` at granularity alignment (lowest offset on ties).
  uint64_t best_fit_offset(uint64_t bytes) const {
    uint64_t best_size = UINT64_MAX, best_off = UINT64_MAX;
    for (auto [start, end] : gaps()) {
      if (end - start >= bytes && end - start < best_size) {
        best_size = end - start;
        best_off = start;
      }
    }
    return best_off;
  }
  uint64_t used() const {
    uint64_t u = 0;
    for (const auto& [off, b] : live) u += b.size;
    return u;
  }

  std::map<uint64_t, ModelBlock> live;  // by offset
  uint64_t capacity_;
  uint64_t granularity_;
};

void check_against_model(const Arena& arena, const Model& model, uint64_t peak) {
  absl::Status inv = arena.check_invariants();
  INFO(inv.ToString());
  REQUIRE(inv.ok());
  std::vector<BlockInfo> blocks;
  arena.for_each_block([&](const BlockInfo& b) { blocks.push_back(b); });
  REQUIRE(blocks.size() == model.live.size());
  auto it = model.live.begin();
  for (const BlockInfo& b : blocks) {
    REQUIRE(b.offset == it->first);
    REQUIRE(b.handle == it->second.handle);
    REQUIRE(b.size == it->second.size);
    REQUIRE(b.pins == it->second.pins);
    REQUIRE(b.offset % it->second.alignment == 0);
    ++it;
  }
  ArenaStats s = arena.stats();
  uint64_t largest = 0;
  for (auto [start, end] : model.gaps()) largest = std::max(largest, end - start);
  REQUIRE(s.used == model.used());
  REQUIRE(s.free == model.capacity_ - model.used());
  REQUIRE(s.largest_free == largest);
  REQUIRE(s.live_blocks == model.live.size());
  REQUIRE(s.peak_used == peak);
  double frag = s.free == 0 ? 0.0 : 1.0 - double(largest) / double(s.free);
  REQUIRE(s.fragmentation == Approx(frag));
}

TEST_CASE("randomized alloc/free/pin agrees with a reference model", "[arena][random]") {
  const uint64_t seed = GENERATE(1, 2, 3, 4, 5);
  const uint64_t granularity = GENERATE(256, 4096);
  INFO("seed " << seed << " granularity " << granularity);
  std::mt19937_64 rng(seed);
  const uint64_t capacity = granularity * 1024;
  Arena arena = make_arena(capacity, granularity);
  Model model(capacity, granularity);
  uint64_t peak = 0, allocations = 0, frees = 0, failures = 0;

  auto random_live = [&]() {
    auto it = model.live.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, model.live.size() - 1)(rng));
    return it;
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op < 5 || model.live.empty()) {
      // Mostly small blocks, sometimes large ones; a quarter over-aligned.
      uint64_t bytes = std::uniform_int_distribution<uint64_t>(1, granularity * 8)(rng);
      if (op == 0) bytes *= 16;
      uint64_t alignment = 0;
      if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
        alignment = uint64_t{1} << std::uniform_int_distribution<int>(0, 16)(rng);
      }
      const uint64_t rounded = (bytes + granularity - 1) / granularity * granularity;
      const uint64_t eff_align = std::max(alignment, granularity);
      const uint64_t expect_best = model.best_fit_offset(rounded);
      absl::StatusOr<BlockHandle> h = arena.allocate(bytes, alignment);
      if (h.ok()) {
        const uint64_t off = arena.offset(*h);
        REQUIRE(arena.size(*h) == rounded);
        REQUIRE(off % eff_align == 0);
        if (eff_align == granularity) REQUIRE(off == expect_best);
        REQUIRE(!model.live.contains(off));
        model.live[off] = ModelBlock{*h, rounded, eff_align};
        ++allocations;
        peak = std::max(peak, model.used());
      } else {
        REQUIRE(absl::IsResourceExhausted(h.status()));
        // The arena never fails while a fitting hole exists.
        REQUIRE(!model.any_gap_fits(rounded, eff_align));
        ++failures;
      }
    } else if (op < 8) {
      auto it = random_live();
      absl::Status st = arena.free(it->second.handle);
      if (it->second.pins != 0) {
        REQUIRE(absl::IsFailedPrecondition(st));
      } else {
        REQUIRE(st.ok());
        BlockHandle stale = it->second.handle;
        model.live.erase(it);
        ++frees;
        REQUIRE(absl::IsNotFound(arena.free(stale)));
      }
    } else if (op == 8) {
      auto it = random_live();
      REQUIRE(arena.pin(it->second.handle).ok());
      ++it->second.pins;
    } else {
      auto it = random_live();
      absl::Status st = arena.unpin(it->second.handle);
      if (it->second.pins == 0) {
        REQUIRE(absl::IsFailedPrecondition(st));
      } else {
        REQUIRE(st.ok());
        --it->second.pins;
      }
    }
    check_against_model(arena, model, peak);
  }
  ArenaStats s = arena.stats();
  CHECK(s.allocations == allocations);
  CHECK(s.frees == frees);
  CHECK(s.failures == failures);
  CHECK(allocations > 500);
  CHECK(failures > 0);  // the capacity is small enough for the trace to hit exhaustion
}

}  // namespace
}  // namespace strata
