// The tensor store on real tiers (GPU arena, pinned CPU tier, NVMe swap in a temporary directory,
// staging), for the store's tests. Device memory is read and written through copies, so the same
// helpers serve every backend.
#pragma once

#include <cstring>
#include <memory>

#include "device/device_fixtures.h"
#include "strata/store/tensor_store.h"
#include "strata/testing/fault_injector.h"
#include "temp_dir.h"

namespace strata::testing {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * 1024;

// Distinct for every (seed, 8-byte word): a copy of another tensor, or of an older version of
// this one, never passes for the expected bytes.
inline uint8_t byte_at(uint32_t seed, uint64_t i) {
  uint64_t x = (uint64_t{seed} << 32) ^ (i >> 3);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x >> ((i & 7) * 8));
}

struct StoreSetup {
  uint64_t gpu_bytes = 4 * kMiB;
  uint64_t cpu_bytes = 16 * kMiB;
  bool nvme = true;
  uint64_t nvme_bytes = 32 * kMiB;
  uint64_t staging_bytes = 4 * 128 * kKiB;  // in 128 KiB chunks
  TensorStoreOptions options;
  std::shared_ptr<FaultInjector> faults;
};

// Tiers, swap space, staging and the store, torn down in the right order.
class Fixture {
 public:
  Fixture(Device& device, const StoreSetup& setup) : device_(device) {
    auto gpu = MemoryTier::create_gpu_arena(device, setup.gpu_bytes);
    auto cpu = MemoryTier::create_pinned_cpu(device, setup.cpu_bytes);
    REQUIRE(gpu.ok());
    REQUIRE(cpu.ok());
    gpu_ = *std::move(gpu);
    cpu_ = *std::move(cpu);
    if (setup.nvme) {
      SwapSpaceOptions swap;
      swap.paths = {dir_.path()};
      swap.bytes_per_path = setup.nvme_bytes;
      swap.stripe_bytes = 64 * kKiB;
      swap.depth = 8;
      swap.engine = IoEngineKind::kIoUring;
      swap.fixed_buffers.push_back(IoBuffer{cpu_->base(), cpu_->capacity()});
      swap.faults = setup.faults;
      auto space = SwapSpace::create(swap);
      REQUIRE(space.ok());
      swap_ = *std::move(space);
      auto staging = StagingPool::create(*cpu_, setup.staging_bytes, 128 * kKiB);
      REQUIRE(staging.ok());
      staging_ = *std::move(staging);
    }
    auto store =
        TensorStore::create(device, *gpu_, *cpu_, swap_.get(), staging_.get(), setup.options);
    REQUIRE(store.ok());
    store_ = *std::move(store);
    auto stream = device.create_stream();
    REQUIRE(stream.ok());
    stream_ = *std::move(stream);
    auto host = device.allocate_pinned(8 * kMiB, "test buffer");
    REQUIRE(host.ok());
    host_ = *std::move(host);
  }

  TensorStore& store() { return *store_; }
  Device& device() { return device_; }
  MemoryTier& gpu() { return *gpu_; }
  Stream& stream() { return *stream_; }
  SwapSpace* swap() { return swap_.get(); }

  // Writes `seed`'s pattern into the tensor (every byte) through an acquire in `tier`.
  void write(TensorHandle t, uint64_t bytes, uint32_t seed, TierKind tier = TierKind::kGpu,
             AccessMode mode = AccessMode::kWrite) {
    auto* host = static_cast<uint8_t*>(host_->data());
    for (uint64_t i = 0; i < bytes; ++i) host[i] = byte_at(seed, i);
    auto address = store_->acquire(t, tier, *stream_, mode);
    REQUIRE(address.ok());
    if (tier == TierKind::kGpu) {
      REQUIRE(device_.copy_async(*address, host, bytes, CopyKind::kHostToDevice, *stream_).ok());
    } else {
      std::memcpy(*address, host, bytes);
    }
    REQUIRE(store_->release(t, *stream_).ok());
    REQUIRE(device_.synchronize(*stream_).ok());
  }

  // True when the tensor, acquired in `tier`, holds `seed`'s pattern.
  bool holds(TensorHandle t, uint64_t bytes, uint32_t seed, TierKind tier = TierKind::kGpu) {
    auto* host = static_cast<uint8_t*>(host_->data());
    std::memset(host, 0, bytes);
    auto address = store_->acquire(t, tier, *stream_, AccessMode::kRead);
    if (!address.ok()) {
      UNSCOPED_INFO("acquire failed: " << address.status().message());
      return false;
    }
    if (tier == TierKind::kGpu) {
      REQUIRE(device_.copy_async(host, *address, bytes, CopyKind::kDeviceToHost, *stream_).ok());
      REQUIRE(device_.synchronize(*stream_).ok());
    } else {
      std::memcpy(host, *address, bytes);
    }
    REQUIRE(store_->release(t, *stream_).ok());
    for (uint64_t i = 0; i < bytes; ++i) {
      if (host[i] != byte_at(seed, i)) return false;
    }
    return true;
  }

 private:
  Device& device_;
  TempDir dir_;
  std::unique_ptr<MemoryTier> gpu_;
  std::unique_ptr<MemoryTier> cpu_;
  std::unique_ptr<SwapSpace> swap_;
  std::unique_ptr<StagingPool> staging_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<PinnedHostMemory> host_;
};

}  // namespace strata::testing
