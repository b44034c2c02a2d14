// Arena placement: kHigh blocks at the top, the high reserve that keeps kLow blocks below it,
// kAnywhere's spill into it, and a randomized comparison of all three against a reference model.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "strata/allocator/arena.h"

namespace strata {
namespace {

constexpr uint64_t kUnit = 256;

Arena make_arena(uint64_t units) {
  absl::StatusOr<Arena> arena = Arena::create(units * kUnit, kUnit);
  REQUIRE(arena.ok());
  return std::move(*arena);
}

BlockHandle alloc(Arena& arena, uint64_t units, Placement placement) {
  absl::StatusOr<BlockHandle> h = arena.allocate(units * kUnit, 0, placement);
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  return *h;
}

TEST_CASE("kHigh puts a block at the top of the highest hole that fits", "[arena][placement]") {
  Arena arena = make_arena(64);
  CHECK(arena.offset(alloc(arena, 4, Placement::kHigh)) == 60 * kUnit);
  CHECK(arena.offset(alloc(arena, 2, Placement::kHigh)) == 58 * kUnit);
  BlockHandle low = alloc(arena, 3, Placement::kLow);
  CHECK(arena.offset(low) == 0);
  BlockHandle top = alloc(arena, 1, Placement::kHigh);
  CHECK(arena.offset(top) == 57 * kUnit);
  CHECK(arena.offset(alloc(arena, 2, Placement::kHigh)) == 55 * kUnit);
  // Holes now: [3, 55) and, once `top` goes, [57, 58). A 2-unit kHigh block skips the higher
  // hole, too small, for the top of the lower one; a 1-unit block takes the higher hole.
  REQUIRE(arena.free(top).ok());
  CHECK(arena.offset(alloc(arena, 2, Placement::kHigh)) == 53 * kUnit);
  CHECK(arena.offset(alloc(arena, 1, Placement::kHigh)) == 57 * kUnit);
  // Over-aligned: the top of the hole aligned down.
  absl::StatusOr<BlockHandle> aligned = arena.allocate(kUnit, 8 * kUnit, Placement::kHigh);
  REQUIRE(aligned.ok());
  CHECK(arena.offset(*aligned) == 48 * kUnit);
  CHECK(arena.check_invariants().ok());
}

TEST_CASE("a high reserve keeps kLow blocks below it, and kAnywhere spills into it last",
          "[arena][placement]") {
  Arena arena = make_arena(16);
  arena.set_high_reserve(6 * kUnit);
  CHECK(arena.high_reserve() == 6 * kUnit);
  BlockHandle a = alloc(arena, 8, Placement::kLow);
  CHECK(arena.offset(a) == 0);
  // 2 units below the reserve are free: a 3-unit kLow block fails, naming the reserve...
  absl::StatusOr<BlockHandle> no = arena.allocate(3 * kUnit, 0, Placement::kLow);
  REQUIRE(absl::IsResourceExhausted(no.status()));
  CHECK_THAT(std::string(no.status().message()),
             Catch::Contains("the top 1536 bytes are reserved"));
  // ...kAnywhere takes it (at the lowest fitting hole), and kHigh still finds the top.
  CHECK(arena.offset(alloc(arena, 3, Placement::kAnywhere)) == 8 * kUnit);
  CHECK(arena.offset(alloc(arena, 2, Placement::kHigh)) == 14 * kUnit);
  // kAnywhere is best-fit over the whole arena when nothing below the reserve fits...
  CHECK(arena.offset(alloc(arena, 1, Placement::kAnywhere)) == 11 * kUnit);
  // ...and below it when something does: the 8-unit hole at 0, not the smaller one at 12.
  REQUIRE(arena.free(a).ok());
  CHECK(arena.offset(alloc(arena, 1, Placement::kAnywhere)) == 0);
  // Compaction never opens a kLow block's hole inside the reserve.
  arena.set_high_reserve(16 * kUnit);
  CHECK(arena.high_reserve() == 16 * kUnit);  // capped at the capacity
  auto no_copy = [](const CompactionPlan&) { return absl::OkStatus(); };
  CHECK(absl::IsResourceExhausted(
      arena.allocate_compacting(kUnit, 0, no_copy, Placement::kLow).status()));
  arena.set_high_reserve(0);
  CHECK(arena.allocate_compacting(kUnit, 0, no_copy, Placement::kLow).ok());
  CHECK(arena.check_invariants().ok());
}

TEST_CASE("with the window reserved, pinned long-lived blocks do not split it",
          "[arena][placement]") {
  // An arena of 13 units whose last 8 are an activation window. A long-lived block (5 units,
  // evictable) sits low when a parameter (1 unit) is loaded and pinned for the step; then the
  // long-lived block goes and an activation of 8 units comes.
  auto no_copy = [](const CompactionPlan&) { return absl::OkStatus(); };
  SECTION("without a reserve the parameter lands after it and splits the free space") {
    Arena arena = make_arena(13);
    BlockHandle states = alloc(arena, 5, Placement::kLow);
    BlockHandle param = alloc(arena, 1, Placement::kLow);
    REQUIRE(arena.pin(param).ok());
    CHECK(arena.offset(param) == 5 * kUnit);
    REQUIRE(arena.free(states).ok());
    // 12 units free, in holes of 5 and 7 on either side of the pinned parameter.
    CHECK(absl::IsResourceExhausted(
        arena.allocate_compacting(8 * kUnit, 0, no_copy, Placement::kHigh).status()));
  }
  SECTION("with it the parameter fails below the window (its owner evicts) and then goes low") {
    Arena arena = make_arena(13);
    arena.set_high_reserve(8 * kUnit);
    BlockHandle states = alloc(arena, 5, Placement::kLow);
    absl::StatusOr<BlockHandle> refused = arena.allocate(kUnit, 0, Placement::kLow);
    CHECK(absl::IsResourceExhausted(refused.status()));
    REQUIRE(arena.free(states).ok());  // what the store does: evict, then try again
    BlockHandle param = alloc(arena, 1, Placement::kLow);
    REQUIRE(arena.pin(param).ok());
    CHECK(arena.offset(param) == 0);
    absl::StatusOr<BlockHandle> activation = arena.allocate(8 * kUnit, 0, Placement::kHigh);
    REQUIRE(activation.ok());
    CHECK(arena.offset(*activation) == 5 * kUnit);
    CHECK(arena.check_invariants().ok());
  }
}

// ---- randomized comparison against a reference model ----

struct Gap {
  uint64_t start, end;
};

std::vector<Gap> gaps_of(const std::map<uint64_t, uint64_t>& live, uint64_t capacity) {
  std::vector<Gap> out;
  uint64_t cursor = 0;
  for (const auto& [offset, size] : live) {
    if (offset > cursor) out.push_back({cursor, offset});
    cursor = offset + size;
  }
  if (capacity > cursor) out.push_back({cursor, capacity});
  return out;
}

// Where the model expects a block of `bytes` (granularity-aligned), or nullopt.
std::optional<uint64_t> expected_offset(const std::vector<Gap>& gaps, uint64_t bytes,
                                        Placement placement, uint64_t limit) {
  if (placement == Placement::kHigh) {
    std::optional<uint64_t> best;
    for (const Gap& g : gaps) {
      if (g.end - g.start >= bytes) best = g.end - bytes;  // gaps are in address order
    }
    return best;
  }
  auto best_fit = [&](uint64_t bound) -> std::optional<uint64_t> {
    uint64_t best_size = UINT64_MAX;
    std::optional<uint64_t> best;
    for (const Gap& g : gaps) {
      if (g.end - g.start >= bytes && g.start + bytes <= bound && g.end - g.start < best_size) {
        best_size = g.end - g.start;
        best = g.start;
      }
    }
    return best;
  };
  std::optional<uint64_t> below = best_fit(limit);
  if (below.has_value() || placement == Placement::kLow) return below;
  return best_fit(UINT64_MAX);
}

TEST_CASE("randomized placements agree with a reference model", "[arena][placement][random]") {
  const uint64_t seed = GENERATE(1, 2, 3, 4);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const uint64_t units = 512;
  const uint64_t capacity = units * kUnit;
  Arena arena = make_arena(units);
  std::map<uint64_t, uint64_t> live;  // offset -> size
  std::map<uint64_t, BlockHandle> handles;
  uint64_t reserve = 0;
  int placed[3] = {0, 0, 0};
  for (int step = 0; step < 4000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 19)(rng);
    if (op == 0) {
      reserve = std::uniform_int_distribution<uint64_t>(0, units / 2)(rng) * kUnit;
      arena.set_high_reserve(reserve);
    } else if (op < 11 || live.empty()) {
      const auto placement = static_cast<Placement>(std::uniform_int_distribution<int>(0, 2)(rng));
      const uint64_t bytes = std::uniform_int_distribution<uint64_t>(1, 24)(rng) * kUnit;
      const auto expect =
          expected_offset(gaps_of(live, capacity), bytes, placement, capacity - reserve);
      absl::StatusOr<BlockHandle> h = arena.allocate(bytes, 0, placement);
      INFO("step " << step << " placement " << static_cast<int>(placement) << " bytes " << bytes
                   << " reserve " << reserve << " " << h.status().ToString());
      REQUIRE(h.ok() == expect.has_value());
      if (h.ok()) {
        REQUIRE(arena.offset(*h) == *expect);
        live[*expect] = bytes;
        handles[*expect] = *h;
        ++placed[static_cast<int>(placement)];
      } else {
        REQUIRE(absl::IsResourceExhausted(h.status()));
      }
    } else {
      auto it = live.begin();
      std::advance(it, std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng));
      REQUIRE(arena.free(handles[it->first]).ok());
      handles.erase(it->first);
      live.erase(it);
    }
    REQUIRE(arena.check_invariants().ok());
  }
  // Every placement was exercised, many times.
  for (int count : placed) CHECK(count > 200);
}

}  // namespace
}  // namespace strata
