// The GPU arena and the pinned CPU tier: allocation, compaction that preserves every block's
// bytes and never moves a pinned block, and a concurrent randomized stress test.
#include "strata/store/tier.h"

#include <absl/container/flat_hash_map.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "device/device_fixtures.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = 1 << 20;

uint8_t byte_at(uint32_t seed, uint64_t i) {
  return static_cast<uint8_t>((seed * 2654435761u) ^ (i * 40503u) ^ (i >> 9));
}

// Moves bytes in and out of a GPU-arena block through a pinned buffer, so the same checks run
// where device memory is not addressable from the host.
class BlockIo {
 public:
  BlockIo(Device& device, uint64_t max_bytes) : device_(device) {
    auto pinned = device.allocate_pinned(max_bytes, "test staging");
    auto stream = device.create_stream();
    REQUIRE(pinned.ok());
    REQUIRE(stream.ok());
    pinned_ = *std::move(pinned);
    stream_ = *std::move(stream);
  }
  void fill(MemoryTier& tier, BlockHandle block, uint64_t bytes, uint32_t seed) {
    auto* host = static_cast<uint8_t*>(pinned_->data());
    for (uint64_t i = 0; i < bytes; ++i) host[i] = byte_at(seed, i);
    auto address = tier.address(block);
    REQUIRE(address.ok());
    REQUIRE(tier.order_after_compaction(*stream_).ok());  // compaction copies are not waited for
    REQUIRE(device_.copy_async(*address, host, bytes, CopyKind::kHostToDevice, *stream_).ok());
    REQUIRE(device_.synchronize(*stream_).ok());
  }
  bool matches(MemoryTier& tier, BlockHandle block, uint64_t bytes, uint32_t seed) {
    auto* host = static_cast<uint8_t*>(pinned_->data());
    std::memset(host, 0, bytes);
    auto address = tier.address(block);
    REQUIRE(address.ok());
    REQUIRE(tier.order_after_compaction(*stream_).ok());
    REQUIRE(device_.copy_async(host, *address, bytes, CopyKind::kDeviceToHost, *stream_).ok());
    REQUIRE(device_.synchronize(*stream_).ok());
    for (uint64_t i = 0; i < bytes; ++i) {
      if (host[i] != byte_at(seed, i)) return false;
    }
    return true;
  }

 private:
  Device& device_;
  std::unique_ptr<PinnedHostMemory> pinned_;
  std::unique_ptr<Stream> stream_;
};

struct Live {
  BlockHandle block;
  uint64_t bytes;
  uint32_t seed;
};

STRATA_BOTH_BACKENDS("GPU arena compacts fragmented free space and keeps every byte",
                     "[tier][compaction]") {
  auto tier = MemoryTier::create_gpu_arena(device, 64 * kMiB);
  REQUIRE(tier.ok());
  MemoryTier& gpu = **tier;
  BlockIo io(device, 16 * kMiB);
  const uint64_t capacity = gpu.capacity();
  REQUIRE(capacity >= 62 * kMiB);

  // Fill with 1 MiB blocks, then free every other one: half the arena free, no hole > 1 MiB.
  std::vector<Live> live;
  for (uint32_t i = 0; i < capacity / kMiB; ++i) {
    auto block = gpu.allocate(kMiB);
    REQUIRE(block.ok());
    live.push_back({*block, kMiB, i + 1});
    io.fill(gpu, *block, kMiB, i + 1);
  }
  std::vector<Live> kept;
  for (size_t i = 0; i < live.size(); ++i) {
    if (i % 2 == 0) {
      REQUIRE(gpu.free(live[i].block).ok());
    } else {
      kept.push_back(live[i]);
    }
  }
  // Pin a few survivors near the top: compaction must work around them.
  std::vector<std::pair<BlockHandle, void*>> pinned;
  for (size_t i = kept.size() - 3; i < kept.size(); ++i) {
    REQUIRE(gpu.pin(kept[i].block).ok());
    pinned.emplace_back(kept[i].block, *gpu.address(kept[i].block));
  }
  const TierStats before = gpu.stats();
  CHECK(before.arena.largest_free < 16 * kMiB);
  CHECK(before.arena.free >= 16 * kMiB);

  auto big = gpu.allocate(16 * kMiB);
  REQUIRE(big.ok());
  io.fill(gpu, *big, 16 * kMiB, 999);

  const TierStats after = gpu.stats();
  CHECK(after.arena.compactions == before.arena.compactions + 1);
  CHECK(after.arena.bytes_moved > 0);
  CHECK(after.compaction_copies > 0);
  REQUIRE(gpu.check_invariants().ok());
  for (const auto& [block, address] : pinned) CHECK(*gpu.address(block) == address);
  for (const Live& l : kept) CHECK(io.matches(gpu, l.block, l.bytes, l.seed));
  CHECK(io.matches(gpu, *big, 16 * kMiB, 999));
  for (const auto& [block, address] : pinned) REQUIRE(gpu.unpin(block).ok());
}

TEST_CASE("GPU compaction does not wait for its copies, later work is ordered after them",
          "[tier][compaction]") {
  // Held at the gate, the compaction's device-to-device copies have not run when allocate()
  // returns; work ordered with order_after_compaction() still sees every byte in place.
  auto gate = std::make_shared<HostCopyGate>();
  HostDeviceOptions options;
  options.gate = gate;
  auto device = testing::host_device(options);
  auto tier = MemoryTier::create_gpu_arena(*device, 16 * kMiB);
  REQUIRE(tier.ok());
  MemoryTier& gpu = **tier;
  BlockIo io(*device, 8 * kMiB);
  std::vector<Live> live;
  for (uint32_t i = 0; i < gpu.capacity() / kMiB; ++i) {
    auto block = gpu.allocate(kMiB);
    REQUIRE(block.ok());
    live.push_back({*block, kMiB, 300 + i});
    io.fill(gpu, *block, kMiB, 300 + i);
  }
  std::vector<Live> kept;
  for (size_t i = 0; i < live.size(); ++i) {
    if (i % 2 == 0) {
      REQUIRE(gpu.free(live[i].block).ok());
    } else {
      kept.push_back(live[i]);
    }
  }
  CHECK(gpu.pending_compaction() == nullptr);
  gate->close(CopyKind::kDeviceToDevice);
  auto big = gpu.allocate(4 * kMiB);  // needs compaction; must not wait for its copies
  REQUIRE(big.ok());
  gate->wait_held(CopyKind::kDeviceToDevice, 1);  // the first copy sits at the gate
  CHECK(gpu.stats().arena.compactions == 1);
  CHECK(gpu.pending_compaction() != nullptr);
  gate->open(CopyKind::kDeviceToDevice);
  io.fill(gpu, *big, 4 * kMiB, 999);  // ordered after the compaction
  for (const Live& l : kept) CHECK(io.matches(gpu, l.block, l.bytes, l.seed));
  CHECK(io.matches(gpu, *big, 4 * kMiB, 999));
  REQUIRE(gpu.synchronize_compaction().ok());
  CHECK(gpu.pending_compaction() == nullptr);
}

STRATA_BOTH_BACKENDS("Compaction slides a large block by less than its size",
                     "[tier][compaction]") {
  // [small][large........][filler....][tail hole]: freeing `small` and asking for small + tail
  // forces `large` to slide down by a few KiB, an overlapping move done through the bounce buffer.
  auto tier = MemoryTier::create_gpu_arena(device, 64 * kMiB);
  REQUIRE(tier.ok());
  MemoryTier& gpu = **tier;
  BlockIo io(device, 40 * kMiB);
  const uint64_t capacity = gpu.capacity();
  auto small = gpu.allocate(4096);
  auto large = gpu.allocate(40 * kMiB);
  REQUIRE(small.ok());
  REQUIRE(large.ok());
  const uint64_t filler_bytes = capacity - 40 * kMiB - 4096 - 8192;
  auto filler = gpu.allocate(filler_bytes);
  REQUIRE(filler.ok());
  io.fill(gpu, *large, 40 * kMiB, 1);
  io.fill(gpu, *filler, std::min<uint64_t>(filler_bytes, 40 * kMiB), 2);
  REQUIRE(gpu.free(*small).ok());

  auto request = gpu.allocate(4096 + 8192);
  REQUIRE(request.ok());
  CHECK(gpu.stats().arena.compactions == 1);
  CHECK(io.matches(gpu, *large, 40 * kMiB, 1));
  CHECK(io.matches(gpu, *filler, std::min<uint64_t>(filler_bytes, 40 * kMiB), 2));
  REQUIRE(gpu.check_invariants().ok());
}

STRATA_BOTH_BACKENDS("A tier out of bytes says so and moves nothing", "[tier]") {
  auto tier = MemoryTier::create_gpu_arena(device, 8 * kMiB);
  REQUIRE(tier.ok());
  MemoryTier& gpu = **tier;
  BlockIo io(device, 8 * kMiB);
  auto a = gpu.allocate(3 * kMiB);
  auto b = gpu.allocate(3 * kMiB);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  io.fill(gpu, *a, 3 * kMiB, 5);
  void* a_address = *gpu.address(*a);
  auto c = gpu.allocate(3 * kMiB);
  REQUIRE(absl::IsResourceExhausted(c.status()));
  CHECK(gpu.stats().arena.compactions == 0);
  CHECK(*gpu.address(*a) == a_address);
  CHECK(io.matches(gpu, *a, 3 * kMiB, 5));
}

TEST_CASE("Pinned CPU tier compacts with memmove and keeps every byte", "[tier][compaction]") {
  auto device = testing::host_device();
  auto tier = MemoryTier::create_pinned_cpu(*device, 16 * kMiB);
  REQUIRE(tier.ok());
  MemoryTier& cpu = **tier;
  CHECK(cpu.kind() == TierKind::kCpu);
  std::vector<Live> live;
  for (uint32_t i = 0; i < 16; ++i) {
    auto block = cpu.allocate(kMiB);
    REQUIRE(block.ok());
    auto* p = static_cast<uint8_t*>(*cpu.address(*block));
    CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
    for (uint64_t j = 0; j < kMiB; ++j) p[j] = byte_at(i, j);
    live.push_back({*block, kMiB, i});
  }
  for (size_t i = 0; i < live.size(); i += 2) REQUIRE(cpu.free(live[i].block).ok());
  auto big = cpu.allocate(6 * kMiB);
  REQUIRE(big.ok());
  CHECK(cpu.stats().arena.compactions == 1);
  for (size_t i = 1; i < live.size(); i += 2) {
    auto* p = static_cast<uint8_t*>(*cpu.address(live[i].block));
    bool same = true;
    for (uint64_t j = 0; j < kMiB && same; ++j) same = p[j] == byte_at(live[i].seed, j);
    CHECK(same);
  }
}

TEST_CASE("Tier sizes that cannot work are refused with the variable to change", "[tier]") {
  auto device = testing::host_device();
  auto gpu = MemoryTier::create_gpu_arena(*device, 100);
  REQUIRE(absl::IsInvalidArgument(gpu.status()));
  CHECK_THAT(std::string(gpu.status().message()), Catch::Contains("STRATA_GPU_BYTES"));
  auto cpu = MemoryTier::create_pinned_cpu(*device, 100);
  REQUIRE(absl::IsInvalidArgument(cpu.status()));
  CHECK_THAT(std::string(cpu.status().message()), Catch::Contains("STRATA_CPU_BYTES"));
  HostDeviceOptions small;
  small.memory_bytes = 4 * kMiB;
  auto limited = testing::host_device(small);
  auto too_big = MemoryTier::create_gpu_arena(*limited, 8 * kMiB);
  REQUIRE(absl::IsResourceExhausted(too_big.status()));
  CHECK_THAT(std::string(too_big.status().message()), Catch::Contains("GPU arena"));
}

TEST_CASE("Concurrent allocate, pin, verify and free with frequent compaction", "[tier][stress]") {
  // Threads share a small arena; each writes its blocks while pinned, then later re-pins and
  // checks them, so any compaction that loses, corrupts or moves a pinned block is caught.
  auto device = testing::host_device();
  auto tier = MemoryTier::create_gpu_arena(*device, 8 * kMiB);
  REQUIRE(tier.ok());
  MemoryTier& gpu = **tier;
  constexpr int kThreads = 4;
  constexpr int kOps = 3000;
  std::atomic<int> corrupt{0}, moved_while_pinned{0}, unexpected_errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t * 7919 + 1));
      std::vector<Live> mine;
      uint32_t next_seed = static_cast<uint32_t>(t) << 24;
      auto check = [&](const Live& l) {
        if (!gpu.pin(l.block).ok()) {
          ++unexpected_errors;
          return;
        }
        // The host reads arena memory directly: compaction copies in flight must be done.
        if (!gpu.synchronize_compaction().ok()) ++unexpected_errors;
        auto* p = static_cast<uint8_t*>(*gpu.address(l.block));
        for (uint64_t j = 0; j < l.bytes; j += 61) {
          if (p[j] != byte_at(l.seed, j)) {
            ++corrupt;
            break;
          }
        }
        if (static_cast<void*>(p) != *gpu.address(l.block)) ++moved_while_pinned;
        if (!gpu.unpin(l.block).ok()) ++unexpected_errors;
      };
      for (int op = 0; op < kOps; ++op) {
        const int choice = static_cast<int>(rng() % 10);
        if (choice < 5 || mine.empty()) {
          const uint64_t bytes = 256 * (1 + rng() % 1024);  // 256 B .. 256 KiB
          auto block = gpu.allocate(bytes);
          if (!block.ok()) {
            if (!absl::IsResourceExhausted(block.status())) ++unexpected_errors;
            continue;
          }
          Live l{*block, bytes, next_seed++};
          if (!gpu.pin(l.block).ok()) ++unexpected_errors;
          if (!gpu.synchronize_compaction().ok()) ++unexpected_errors;
          auto* p = static_cast<uint8_t*>(*gpu.address(l.block));
          for (uint64_t j = 0; j < bytes; ++j) p[j] = byte_at(l.seed, j);
          if (!gpu.unpin(l.block).ok()) ++unexpected_errors;
          mine.push_back(l);
        } else if (choice < 8) {
          check(mine[rng() % mine.size()]);
        } else {
          const size_t i = rng() % mine.size();
          check(mine[i]);
          if (!gpu.free(mine[i].block).ok()) ++unexpected_errors;
          mine[i] = mine.back();
          mine.pop_back();
        }
      }
      for (const Live& l : mine) {
        check(l);
        if (!gpu.free(l.block).ok()) ++unexpected_errors;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(corrupt == 0);
  CHECK(moved_while_pinned == 0);
  CHECK(unexpected_errors == 0);
  REQUIRE(gpu.check_invariants().ok());
  const TierStats stats = gpu.stats();
  CHECK(stats.arena.used == 0);
  CHECK(stats.arena.compactions > 0);  // the test is only worth something if it compacted
}

}  // namespace
}  // namespace strata
