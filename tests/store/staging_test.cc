// StagingPool: a fixed budget of pinned chunks; waiting, never growing; pinned against
// compaction of the CPU tier it lives in.
#include "strata/store/staging.h"

#include <absl/synchronization/notification.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "device/device_fixtures.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST_CASE("Staging hands out its chunks and waits when all are busy", "[staging]") {
  auto device = testing::host_device();
  auto cpu = MemoryTier::create_pinned_cpu(*device, 16 * kMiB);
  REQUIRE(cpu.ok());
  auto pool = StagingPool::create(**cpu, 4 * kMiB + 5, kMiB);  // the odd bytes are dropped
  REQUIRE(pool.ok());
  StagingPool& staging = **pool;
  CHECK(staging.chunks() == 4);
  CHECK((*cpu)->stats().arena.used == 4 * kMiB);

  std::vector<StagingPool::Lease> leases;
  for (int i = 0; i < 4; ++i) leases.push_back(staging.acquire());
  for (const auto& lease : leases) {
    CHECK(lease.bytes() == kMiB);
    CHECK(reinterpret_cast<uintptr_t>(lease.data()) % 4096 == 0);
  }
  CHECK_FALSE(staging.try_acquire().has_value());
  CHECK_FALSE(staging.acquire_for(absl::Milliseconds(5)).has_value());

  std::atomic<bool> got{false};
  std::thread waiter([&] {
    StagingPool::Lease lease = staging.acquire();  // blocks until a chunk comes back
    got = lease.bytes() == kMiB;
  });
  leases.pop_back();  // returns one chunk
  waiter.join();
  CHECK(got);
  const StagingStats stats = staging.stats();
  CHECK(stats.peak_in_use == 4);
  CHECK(stats.waits >= 1);
  CHECK(stats.leases == 5);
}

TEST_CASE("Concurrent moves never hold more staging than the budget", "[staging][stress]") {
  auto device = testing::host_device();
  auto cpu = MemoryTier::create_pinned_cpu(*device, 8 * kMiB);
  REQUIRE(cpu.ok());
  auto pool = StagingPool::create(**cpu, 3 * 64 * 1024, 64 * 1024);
  REQUIRE(pool.ok());
  std::atomic<int> held{0}, over_budget{0}, overlaps{0};
  std::vector<std::atomic<int>> owners(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        StagingPool::Lease lease = (*pool)->acquire();
        if (++held > 3) ++over_budget;
        // Each chunk has one holder at a time: write a mark, check nobody else did.
        auto* mark = static_cast<int*>(lease.data());
        *mark = t;
        std::this_thread::yield();
        if (*mark != t) ++overlaps;
        --held;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(over_budget == 0);
  CHECK(overlaps == 0);
  CHECK((*pool)->stats().in_use == 0);
  CHECK((*pool)->stats().peak_in_use <= 3);
}

TEST_CASE("Staging memory is pinned: CPU-tier compaction never moves it", "[staging]") {
  auto device = testing::host_device();
  auto cpu = MemoryTier::create_pinned_cpu(*device, 8 * kMiB);
  REQUIRE(cpu.ok());
  auto pool = StagingPool::create(**cpu, 2 * kMiB, kMiB);
  REQUIRE(pool.ok());
  StagingPool::Lease lease = (*pool)->acquire();
  void* const before = lease.data();
  std::memset(before, 0x5a, kMiB);
  std::vector<BlockHandle> filler;
  for (;;) {
    auto block = (*cpu)->allocate(kMiB);
    if (!block.ok()) break;
    filler.push_back(*block);
  }
  REQUIRE(filler.size() == 6);
  REQUIRE((*cpu)->free(filler[0]).ok());
  REQUIRE((*cpu)->free(filler[2]).ok());  // two 1 MiB holes beside the pool
  auto two = (*cpu)->allocate(2 * kMiB);  // only compaction can make room
  REQUIRE(two.ok());
  CHECK((*cpu)->stats().arena.compactions == 1);
  CHECK(lease.data() == before);
  CHECK(static_cast<unsigned char*>(before)[kMiB - 1] == 0x5a);
  StagingPool::Lease again = (*pool)->acquire();
  CHECK(std::abs(static_cast<std::byte*>(again.data()) - static_cast<std::byte*>(before)) ==
        static_cast<std::ptrdiff_t>(kMiB));
}

TEST_CASE("Staging sizes that cannot work are refused with the variable to change", "[staging]") {
  auto device = testing::host_device();
  auto cpu = MemoryTier::create_pinned_cpu(*device, 4 * kMiB);
  REQUIRE(cpu.ok());
  auto none = StagingPool::create(**cpu, 1000, 4096);
  REQUIRE(absl::IsInvalidArgument(none.status()));
  CHECK_THAT(std::string(none.status().message()), Catch::Contains("STRATA_STAGING_BYTES"));
  CHECK(absl::IsInvalidArgument(StagingPool::create(**cpu, kMiB, 5000).status()));
  auto too_big = StagingPool::create(**cpu, 8 * kMiB, kMiB);
  REQUIRE(absl::IsResourceExhausted(too_big.status()));
  CHECK_THAT(std::string(too_big.status().message()), Catch::Contains("STRATA_CPU_BYTES"));
  auto gpu = MemoryTier::create_gpu_arena(*device, 4 * kMiB);
  REQUIRE(gpu.ok());
  CHECK(absl::IsInvalidArgument(StagingPool::create(**gpu, kMiB, kMiB).status()));
}

}  // namespace
}  // namespace strata
