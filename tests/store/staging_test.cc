// StagingPool: a fixed budget of pinned memory leased in pieces of at most a chunk; waiting in
// turn, never growing; pinned against compaction of the CPU tier it lives in.
#include "strata/store/staging.h"

#include <absl/synchronization/notification.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
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
  constexpr uint64_t kChunk = 64 * 1024;
  auto pool = StagingPool::create(**cpu, 3 * kChunk, kChunk);
  REQUIRE(pool.ok());
  std::atomic<uint64_t> held{0};
  std::atomic<int> over_budget{0}, overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 500; ++i) {
        // Whole chunks and pieces of every size, as moves of large and small tensors lease.
        const uint64_t want = rng() % 3 == 0 ? kChunk : 1 + rng() % kChunk;
        StagingPool::Lease lease = rng() % 2 == 0 ? (*pool)->acquire() : (*pool)->acquire(want);
        if ((held += lease.bytes()) > 3 * kChunk) ++over_budget;
        // Each byte has one holder at a time: mark the whole lease, check nobody else did.
        auto* words = static_cast<int*>(lease.data());
        const size_t n = lease.bytes() / sizeof(int);
        for (size_t k = 0; k < n; k += 97) words[k] = t;
        std::this_thread::yield();
        for (size_t k = 0; k < n; k += 97) {
          if (words[k] != t) ++overlaps;
        }
        held -= lease.bytes();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(over_budget == 0);
  CHECK(overlaps == 0);
  CHECK((*pool)->stats().in_use == 0);
  CHECK((*pool)->stats().in_use_bytes == 0);
  CHECK((*pool)->stats().peak_in_use_bytes <= 3 * kChunk);
}

TEST_CASE("Staging leases as much as a move carries, not a whole chunk", "[staging]") {
  // Issue 23: with STRATA_STAGING_BYTES split into 8 chunks, eight 1 MiB tensors' moves took the
  // whole budget (32 MiB chunks each), and the ninth waited.
  auto device = testing::host_device();
  auto cpu = MemoryTier::create_pinned_cpu(*device, 16 * kMiB);
  REQUIRE(cpu.ok());
  auto pool = StagingPool::create(**cpu, 4 * kMiB, kMiB);
  REQUIRE(pool.ok());
  StagingPool& staging = **pool;
  std::vector<StagingPool::Lease> small;
  for (int i = 0; i < 16; ++i) small.push_back(staging.acquire(256 * 1024 - 100));
  for (const auto& lease : small) {
    CHECK(lease.bytes() == 256 * 1024);  // rounded up to 4 KiB
    CHECK(reinterpret_cast<uintptr_t>(lease.data()) % 4096 == 0);
  }
  StagingStats stats = staging.stats();
  CHECK(stats.in_use == 16);
  CHECK(stats.in_use_bytes == 4 * kMiB);
  CHECK(stats.waits == 0);
  CHECK_FALSE(staging.try_acquire().has_value());
  small.resize(12);  // a chunk's worth back
  StagingPool::Lease big = staging.acquire(8 * kMiB);
  CHECK(big.bytes() == kMiB);  // never more than a chunk
  stats = staging.stats();
  CHECK(stats.peak_in_use == 16);
  CHECK(stats.peak_in_use_bytes == 4 * kMiB);
  CHECK(stats.bytes == 4 * kMiB);
  small.clear();
  staging.reset_peak();
  CHECK(staging.stats().peak_in_use == 1);
  CHECK(staging.stats().peak_in_use_bytes == kMiB);
}

TEST_CASE("A chunk-sized lease is served in turn, not starved by smaller ones", "[staging]") {
  auto device = testing::host_device();
  auto cpu = MemoryTier::create_pinned_cpu(*device, 16 * kMiB);
  REQUIRE(cpu.ok());
  auto pool = StagingPool::create(**cpu, 2 * kMiB, kMiB);
  REQUIRE(pool.ok());
  StagingPool& staging = **pool;
  std::vector<StagingPool::Lease> held;
  for (int i = 0; i < 8; ++i) held.push_back(staging.acquire(256 * 1024));
  absl::Notification big_waits, big_got;
  std::thread big([&] {
    big_waits.Notify();
    StagingPool::Lease lease = staging.acquire();  // a whole chunk: waits
    big_got.Notify();
  });
  big_waits.WaitForNotification();
  while (staging.stats().waits == 0) std::this_thread::yield();
  // Room for a small lease comes back; one asked for now queues behind the chunk.
  held.pop_back();
  CHECK_FALSE(staging.acquire_for(absl::Milliseconds(20)).has_value());
  CHECK_FALSE(big_got.HasBeenNotified());
  held.pop_back();
  held.pop_back();
  held.pop_back();  // a whole chunk free now: the waiter first
  big_got.WaitForNotification();
  big.join();
  CHECK(staging.stats().in_use == 4);
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
