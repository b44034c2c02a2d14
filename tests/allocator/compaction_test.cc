// Arena compaction: plans executed with memmove over a host buffer standing in for device
// memory, content checked at the new offsets; plan quality, epochs, failure safety, pins.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "strata/allocator/arena.h"

namespace strata {
namespace {

// A host buffer plus an Arena over it; every live block holds a pattern derived from its handle.
class Memory {
 public:
  explicit Memory(uint64_t capacity, uint64_t granularity = 256)
      : arena_(Arena::create(capacity, granularity).value()), bytes_(capacity) {}

  BlockHandle alloc(uint64_t bytes, uint64_t alignment = 0) {
    absl::StatusOr<BlockHandle> h = arena_.allocate(bytes, alignment);
    INFO(h.status().ToString());
    REQUIRE(h.ok());
    fill(*h);
    return *h;
  }
  absl::StatusOr<BlockHandle> alloc_compacting(uint64_t bytes, uint64_t alignment = 0) {
    absl::StatusOr<BlockHandle> h = arena_.allocate_compacting(
        bytes, alignment, [&](const CompactionPlan& plan) { return execute(plan); });
    if (h.ok()) fill(*h);
    return h;
  }
  void release(BlockHandle h) { REQUIRE(arena_.free(h).ok()); }

  absl::Status execute(const CompactionPlan& plan) {
    for (const CompactionMove& m : plan.moves) {
      REQUIRE(m.to < m.from);
      std::memmove(bytes_.data() + m.to, bytes_.data() + m.from, m.bytes);
    }
    return absl::OkStatus();
  }

  // Every live block still holds its own pattern, wherever it now lives.
  void verify() const {
    absl::Status inv = arena_.check_invariants();
    INFO(inv.ToString());
    REQUIRE(inv.ok());
    arena_.for_each_block([&](const BlockInfo& b) {
      for (uint64_t i = 0; i < b.size; i += 61) {
        REQUIRE(bytes_[b.offset + i] == pattern(b.handle, i));
      }
      REQUIRE(bytes_[b.offset + b.size - 1] == pattern(b.handle, b.size - 1));
    });
  }

  std::map<uint32_t, uint64_t> offsets() const {
    std::map<uint32_t, uint64_t> out;
    arena_.for_each_block([&](const BlockInfo& b) { out[b.handle.index] = b.offset; });
    return out;
  }

  Arena& arena() { return arena_; }

 private:
  static std::byte pattern(BlockHandle h, uint64_t i) {
    return static_cast<std::byte>((h.index * 131 + h.generation * 17 + i * 7) & 0xff);
  }
  void fill(BlockHandle h) {
    const uint64_t off = arena_.offset(h), size = arena_.size(h);
    for (uint64_t i = 0; i < size; ++i) bytes_[off + i] = pattern(h, i);
  }

  Arena arena_;
  std::vector<std::byte> bytes_;
};

TEST_CASE("compaction slides blocks down and keeps their bytes", "[compaction]") {
  Memory mem(64 * 1024, 256);
  std::vector<BlockHandle> h;
  for (int i = 0; i < 64; ++i) h.push_back(mem.alloc(1024));
  for (int i = 0; i < 64; i += 2) mem.release(h[i]);  // 32 KiB free, in 1 KiB holes
  const BlockHandle pinned = h[33];
  REQUIRE(mem.arena().pin(pinned).ok());
  const uint64_t pinned_offset = mem.arena().offset(pinned);
  REQUIRE(!mem.arena().allocate(8 * 1024).ok());

  absl::StatusOr<BlockHandle> big = mem.alloc_compacting(8 * 1024);
  INFO(big.status().ToString());
  REQUIRE(big.ok());
  CHECK(mem.arena().size(*big) == 8 * 1024);
  CHECK(mem.arena().offset(pinned) == pinned_offset);
  mem.verify();
  ArenaStats s = mem.arena().stats();
  CHECK(s.compactions == 1);
  // Merging 8 one-KiB holes needs exactly the 7 blocks between them to move.
  CHECK(s.bytes_moved == 7 * 1024);
  CHECK(s.failures == 1);  // the plain allocate above
}

TEST_CASE("a block sliding by less than its size is copied correctly", "[compaction]") {
  Memory mem(16 * 256, 256);
  BlockHandle a = mem.alloc(256);
  BlockHandle b = mem.alloc(10 * 256);  // [256, 2816)
  BlockHandle c = mem.alloc(5 * 256);   // the rest
  mem.release(a);
  // 256 bytes free in total: compaction cannot make 512.
  REQUIRE(absl::IsResourceExhausted(mem.alloc_compacting(512).status()));
  mem.release(c);
  // b slides down by 256 bytes, over 9/10 of its own old range.
  absl::StatusOr<BlockHandle> big = mem.alloc_compacting(6 * 256);
  REQUIRE(big.ok());
  CHECK(mem.arena().offset(b) == 0);
  CHECK(mem.arena().offset(*big) == 10 * 256);
  mem.verify();
}

TEST_CASE("overlapping moves keep content", "[compaction]") {
  Memory mem(32 * 256, 256);
  BlockHandle a = mem.alloc(256);
  BlockHandle b = mem.alloc(10 * 256);
  BlockHandle c = mem.alloc(256);
  BlockHandle d = mem.alloc(12 * 256);
  mem.alloc(8 * 256);  // fills the arena
  mem.release(a);
  mem.release(c);
  // 2 units free in two 1-unit holes; b (10 units) and d (12 units) overlap their old ranges.
  absl::StatusOr<CompactionPlan> plan = mem.arena().plan_compaction(512);
  REQUIRE(plan.ok());
  REQUIRE(plan->moves.size() == 1);
  CHECK(plan->moves[0].block == b);  // b alone merges the two holes; d need not move
  CHECK(plan->moves[0].from == 256);
  CHECK(plan->moves[0].to == 0);
  CHECK(plan->hole_offset == 10 * 256);
  CHECK(plan->hole_bytes == 512);
  REQUIRE(mem.execute(*plan).ok());
  REQUIRE(mem.arena().commit_compaction(*plan).ok());
  mem.verify();
  CHECK(mem.arena().offset(b) == 0);
  CHECK(mem.arena().offset(d) == 12 * 256);
  CHECK(mem.arena().stats().largest_free == 512);
}

TEST_CASE("the plan moves the cheapest run of blocks", "[compaction]") {
  // Layout in units of 256: [h1][B 8][h1][s 1][h1][T rest]. Merging the holes around the small
  // block s costs 1 unit; merging across B would cost 8.
  Memory mem(32 * 256, 256);
  BlockHandle h0 = mem.alloc(256);
  mem.alloc(8 * 256);
  BlockHandle h1 = mem.alloc(256);
  BlockHandle s = mem.alloc(256);
  BlockHandle h2 = mem.alloc(256);
  mem.alloc(20 * 256);
  for (BlockHandle h : {h0, h1, h2}) mem.release(h);
  absl::StatusOr<CompactionPlan> plan = mem.arena().plan_compaction(512);
  REQUIRE(plan.ok());
  REQUIRE(plan->moves.size() == 1);
  CHECK(plan->moves[0].block == s);
  CHECK(plan->bytes_moved == 256);
  // Needing all three holes moves both.
  plan = mem.arena().plan_compaction(768);
  REQUIRE(plan.ok());
  CHECK(plan->bytes_moved == 9 * 256);
  CHECK(plan->hole_bytes == 768);
  REQUIRE(mem.execute(*plan).ok());
  REQUIRE(mem.arena().commit_compaction(*plan).ok());
  mem.verify();
  CHECK(mem.arena().stats().largest_free == 768);
}

TEST_CASE("compaction honours block and request alignment", "[compaction]") {
  Memory mem(64 * 256, 256);
  std::vector<BlockHandle> h;
  for (int i = 0; i < 16; ++i) h.push_back(mem.alloc(256, 1024));  // at units 0, 4, ..., 60
  std::vector<BlockHandle> kept;
  for (int i = 0; i < 16; ++i) {
    if (i == 2 || i == 5 || i == 9 || i == 13) {
      kept.push_back(h[i]);  // at units 8, 20, 36, 52
    } else {
      mem.release(h[i]);
    }
  }
  // Slid down, the 1024-aligned blocks land at units 0, 4, 8, 12 (not 0, 1, 2, 3), so the
  // largest 4096-aligned hole compaction can make is units [16, 64).
  CHECK(absl::IsResourceExhausted(mem.arena().plan_compaction(49 * 256, 4096).status()));
  absl::StatusOr<BlockHandle> big = mem.alloc_compacting(48 * 256, 4096);
  INFO(big.status().ToString());
  REQUIRE(big.ok());
  CHECK(mem.arena().offset(*big) == 4096);
  for (size_t i = 0; i < kept.size(); ++i) CHECK(mem.arena().offset(kept[i]) == i * 1024);
  mem.verify();
}

TEST_CASE("a plan is rejected once the arena changed", "[compaction]") {
  Memory mem(16 * 256, 256);
  std::vector<BlockHandle> h;
  for (int i = 0; i < 8; ++i) h.push_back(mem.alloc(256));
  mem.release(h[0]);
  mem.release(h[2]);
  absl::StatusOr<CompactionPlan> plan = mem.arena().plan_compaction(9 * 256);
  REQUIRE(plan.ok());
  mem.alloc(256);
  absl::Status st = mem.arena().commit_compaction(*plan);
  CHECK(absl::IsFailedPrecondition(st));
  CHECK_THAT(std::string(st.message()), Catch::Contains("changed"));
  // Pinning changes what may move, so it invalidates plans too.
  plan = mem.arena().plan_compaction(9 * 256);
  REQUIRE(plan.ok());
  REQUIRE(mem.arena().pin(h[5]).ok());
  CHECK(absl::IsFailedPrecondition(mem.arena().commit_compaction(*plan)));
  mem.verify();
}

TEST_CASE("a tampered plan is rejected and leaves the arena unchanged", "[compaction]") {
  Memory mem(16 * 256, 256);
  std::vector<BlockHandle> h;
  for (int i = 0; i < 16; ++i) h.push_back(mem.alloc(256));
  mem.release(h[0]);
  mem.release(h[2]);
  absl::StatusOr<CompactionPlan> plan = mem.arena().plan_compaction(512);
  REQUIRE(plan.ok());
  REQUIRE(plan->moves.size() == 1);
  const auto before = mem.offsets();
  CompactionPlan upward = *plan;
  std::swap(upward.moves[0].from, upward.moves[0].to);
  CHECK(absl::IsInvalidArgument(mem.arena().commit_compaction(upward)));
  CompactionPlan onto_neighbour = *plan;
  onto_neighbour.moves[0].block = h[3];
  CHECK(absl::IsInvalidArgument(mem.arena().commit_compaction(onto_neighbour)));
  CHECK(mem.offsets() == before);
  mem.verify();
}

TEST_CASE("a failed copy leaves the arena exactly as it was", "[compaction]") {
  Memory mem(16 * 256, 256);
  std::vector<BlockHandle> h;
  for (int i = 0; i < 16; ++i) h.push_back(mem.alloc(256));
  for (int i = 0; i < 16; i += 3) mem.release(h[i]);
  const auto before = mem.offsets();
  const ArenaStats stats_before = mem.arena().stats();
  const uint64_t epoch_before = mem.arena().epoch();
  int calls = 0;
  absl::StatusOr<BlockHandle> r =
      mem.arena().allocate_compacting(1024, 0, [&](const CompactionPlan& plan) {
        ++calls;
        CHECK(!plan.moves.empty());
        return absl::UnavailableError("DMA engine reported an error");
      });
  CHECK(calls == 1);
  REQUIRE(absl::IsUnavailable(r.status()));
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("DMA engine"));
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("unchanged"));
  CHECK(mem.offsets() == before);
  CHECK(mem.arena().epoch() == epoch_before);
  ArenaStats s = mem.arena().stats();
  CHECK(s.used == stats_before.used);
  CHECK(s.compactions == 0);
  CHECK(s.failures == stats_before.failures + 1);
  mem.verify();
  // The same request succeeds once the copies work.
  CHECK(mem.alloc_compacting(1024).ok());
  mem.verify();
}

TEST_CASE("impossible compactions say why", "[compaction]") {
  Memory mem(8 * 256, 256);
  std::vector<BlockHandle> h;
  for (int i = 0; i < 8; ++i) h.push_back(mem.alloc(256));
  for (int i : {0, 2, 5, 7}) mem.release(h[i]);
  REQUIRE(mem.arena().pin(h[3]).ok());
  REQUIRE(mem.arena().pin(h[4]).ok());
  // 4 units free, but the pinned pair splits them into 2 + 2.
  absl::StatusOr<CompactionPlan> plan = mem.arena().plan_compaction(3 * 256);
  REQUIRE(absl::IsResourceExhausted(plan.status()));
  CHECK_THAT(std::string(plan.status().message()), Catch::Contains("pinned"));
  CHECK_THAT(std::string(plan.status().message()), Catch::Contains("512 bytes"));
  CHECK(absl::IsResourceExhausted(mem.alloc_compacting(3 * 256).status()));
  // Two units fit on either side.
  CHECK(mem.arena().plan_compaction(2 * 256).ok());
  absl::StatusOr<CompactionPlan> too_much = mem.arena().plan_compaction(5 * 256);
  REQUIRE(absl::IsResourceExhausted(too_much.status()));
  CHECK_THAT(std::string(too_much.status().message()), Catch::Contains("only 1024 of 2048"));
  mem.verify();
}

// Sizes alternate between short- and long-lived tensors; a best-fit arena fragments and fails
// while compaction serves the same trace in full.
TEST_CASE("compaction serves a trace that fragments a plain arena", "[compaction]") {
  const uint64_t capacity = 64 * 1024;
  auto run = [&](bool compacting) {
    Memory mem(capacity, 256);
    std::vector<BlockHandle> keep;
    uint64_t failed = 0;
    for (int round = 0; round < 4; ++round) {
      std::vector<BlockHandle> small;
      // Fill the arena with 1 KiB blocks, keep every other one, then ask for 4 KiB blocks:
      // live bytes stay under capacity, but every hole is 1 KiB.
      while (mem.arena().stats().free >= 1024) small.push_back(mem.alloc(1024));
      for (size_t i = 0; i < small.size(); i += 2) mem.release(small[i]);
      for (int i = 0; i < 3; ++i) {
        absl::StatusOr<BlockHandle> big =
            compacting ? mem.alloc_compacting(4096) : mem.arena().allocate(4096);
        if (big.ok()) {
          keep.push_back(*big);
        } else {
          REQUIRE(absl::IsResourceExhausted(big.status()));
          ++failed;
        }
      }
      for (size_t i = 1; i < small.size(); i += 2) mem.release(small[i]);
      mem.verify();
    }
    REQUIRE(mem.arena().stats().failures == failed);
    return mem.arena().stats();
  };
  ArenaStats plain = run(false);
  ArenaStats compacting = run(true);
  CHECK(plain.failures > 0);
  CHECK(compacting.failures == 0);
  CHECK(compacting.compactions > 0);
  CHECK(compacting.bytes_moved > 0);
}

TEST_CASE("randomized compaction keeps every block's bytes", "[compaction][random]") {
  const uint64_t seed = GENERATE(11, 12, 13, 14);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  Memory mem(256 * 1024, 256);
  std::vector<BlockHandle> live;
  uint64_t compacted_allocations = 0;
  for (int step = 0; step < 1500; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op < 5 || live.empty()) {
      const uint64_t bytes = std::uniform_int_distribution<uint64_t>(1, 24 * 1024)(rng);
      const uint64_t alignment = op == 0 ? 4096 : 0;
      const ArenaStats before = mem.arena().stats();
      const bool any_pinned = std::any_of(live.begin(), live.end(),
                                          [&](BlockHandle h) { return mem.arena().is_pinned(h); });
      absl::StatusOr<BlockHandle> h = mem.alloc_compacting(bytes, alignment);
      if (h.ok()) {
        live.push_back(*h);
        compacted_allocations += mem.arena().stats().compactions - before.compactions;
      } else {
        REQUIRE(absl::IsResourceExhausted(h.status()));
        // Without pins and over-alignment, sliding everything down frees the whole tail.
        const uint64_t rounded = (bytes + 255) / 256 * 256;
        if (!any_pinned && alignment == 0) REQUIRE(before.free < rounded);
      }
    } else if (op < 8) {
      const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
      if (mem.arena().is_pinned(live[i])) REQUIRE(mem.arena().unpin(live[i]).ok());
      if (!mem.arena().is_pinned(live[i])) {
        mem.release(live[i]);
        live.erase(live.begin() + static_cast<ptrdiff_t>(i));
      }
    } else if (op == 8) {
      const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
      REQUIRE(mem.arena().pin(live[i]).ok());
    }
    mem.verify();
  }
  CHECK(compacted_allocations > 10);
}

}  // namespace
}  // namespace strata
