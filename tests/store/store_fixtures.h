// The tensor store's conformance rig: a Runtime built from a Config (the public API only, as a
// trainer builds one) for one variant of {host, cuda} x {io_uring, psync} x {with, without
// NVMe}, a pinned buffer for moving bytes in and out of the GPU tier, and checksums of what a
// tensor holds. STRATA_STORE_CONFORMANCE runs one body over every variant (RMM's
// mr_ref_tests.cpp is the model); a cuda variant without a GPU, or an io_uring variant where
// the kernel refuses io_uring, prints "SKIPPED: ..." and CTest reports it as skipped.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "skip.h"
#include "strata/device/backend.h"
#include "strata/runtime/runtime.h"
#include "strata/store/tensor_store.h"
#include "temp_dir.h"

namespace strata::testing {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;

struct StoreVariant {
  Backend backend = Backend::kHost;
  IoEngineKind engine = IoEngineKind::kPsync;
  bool nvme = true;
};

inline std::string describe(const StoreVariant& v) {
  return std::string(v.backend == Backend::kCuda ? "cuda" : "host") + ", " +
         (v.engine == IoEngineKind::kIoUring ? "io_uring" : "psync") + ", " +
         (v.nvme ? "with NVMe" : "without NVMe");
}

// Tier sizes: small, so that every body runs in a few tiers' worth of moves.
struct StoreSizes {
  uint64_t gpu = 2 * kMiB;
  uint64_t cpu = 8 * kMiB;
  uint64_t nvme = 16 * kMiB;  // one path
  uint64_t staging = 1 * kMiB;
  uint64_t io_block = 64 * kKiB;
  uint64_t buffer = 4 * kMiB;  // the largest tensor a body moves through the GPU tier
};

// Bytes that differ for every (seed, 8-byte word): another tensor's bytes, or an older version
// of this one, never pass for the expected ones.
inline uint64_t pattern_word(uint32_t seed, uint64_t word) {
  uint64_t x = (uint64_t{seed} << 32) ^ word;
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline void fill_pattern(void* data, uint64_t bytes, uint32_t seed) {
  auto* p = static_cast<std::byte*>(data);
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t w = pattern_word(seed, i / 8);
    std::memcpy(p + i, &w, std::min<uint64_t>(8, bytes - i));
  }
}

// A 64-bit checksum of `bytes` bytes (position-dependent: swapped words change it).
inline uint64_t checksum(const void* data, uint64_t bytes) {
  const auto* p = static_cast<const std::byte*>(data);
  uint64_t h = 0xcbf29ce484222325ULL ^ bytes;
  for (uint64_t i = 0; i < bytes; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, std::min<uint64_t>(8, bytes - i));
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  return h;
}

// The checksum a tensor written with `seed`'s pattern has.
inline uint64_t pattern_checksum(uint64_t bytes, uint32_t seed) {
  std::string buffer(bytes, '\0');
  fill_pattern(buffer.data(), bytes, seed);
  return checksum(buffer.data(), bytes);
}

// A runtime for one variant, its store, two streams and a pinned transfer buffer.
class StoreRig {
 public:
  // Null after printing "SKIPPED: ..." when the variant cannot run on this machine.
  static std::unique_ptr<StoreRig> create_or_skip(const StoreVariant& variant,
                                                  const StoreSizes& sizes = {},
                                                  TensorStoreOptions options = {}) {
    if (variant.backend == Backend::kCuda) {
      auto choice = choose_backend(Backend::kCuda, 0);
      if (!choice.ok()) {
        skip("no CUDA device: " + std::string(choice.status().message()));
        return nullptr;
      }
    }
    auto rig = std::unique_ptr<StoreRig>(new StoreRig(variant));
    Config config;
    config.backend = variant.backend;
    config.gpu_bytes = SizeSetting::of_bytes(sizes.gpu);
    config.cpu_bytes = SizeSetting::of_bytes(sizes.cpu);
    if (variant.nvme) config.nvme_paths = {rig->dir_.path()};
    config.nvme_bytes = SizeSetting::of_bytes(sizes.nvme);
    config.io_engine = variant.engine;
    config.io_depth = 8;
    config.io_block = sizes.io_block;
    config.staging_bytes = sizes.staging;
    RuntimeOptions runtime_options;
    runtime_options.store = options;
    auto runtime = Runtime::create(config, std::move(runtime_options));
    if (!runtime.ok() && variant.engine == IoEngineKind::kIoUring) {
      // Skip only where the machine itself says io_uring is refused.
      Config probe = config;
      probe.io_engine = IoEngineKind::kAuto;
      auto loaded = load_configuration(probe);
      if (loaded.ok() && !loaded->second.io_uring.available) {
        skip("io_uring is refused here: " + loaded->second.io_uring.detail);
        return nullptr;
      }
    }
    INFO(describe(variant) << ": " << runtime.status());
    REQUIRE(runtime.ok());
    rig->runtime_ = *std::move(runtime);
    REQUIRE(
        rig->runtime_->config().io_engine.kind ==
        (variant.engine == IoEngineKind::kIoUring ? IoEngineKind::kIoUring : IoEngineKind::kPsync));
    REQUIRE((rig->runtime_->nvme() != nullptr) == variant.nvme);
    Device& device = rig->runtime_->device();
    for (auto& stream : rig->streams_) {
      auto made = device.create_stream();
      REQUIRE(made.ok());
      stream = *std::move(made);
    }
    auto buffer = device.allocate_pinned(sizes.buffer, "conformance buffer");
    REQUIRE(buffer.ok());
    rig->buffer_ = *std::move(buffer);
    rig->buffer_bytes_ = sizes.buffer;
    return rig;
  }

  ~StoreRig() {
    // The store goes before the temporary directory; nothing may be left in it.
    runtime_.reset();
  }
  StoreRig(const StoreRig&) = delete;
  StoreRig& operator=(const StoreRig&) = delete;

  const StoreVariant& variant() const { return variant_; }
  Runtime& runtime() { return *runtime_; }
  TensorStore& store() { return runtime_->store(); }
  Stream& stream(int i = 0) { return *streams_[i]; }
  bool nvme() const { return variant_.nvme; }
  size_t swap_dir_entries() const { return dir_.entries(); }

  // Writes `seed`'s pattern to an acquired copy at `address` in `tier`, ordered on stream `s`
  // (the host waits for it); returns the pattern's checksum.
  uint64_t fill(void* address, TierKind tier, uint64_t bytes, uint32_t seed, int s = 0) {
    REQUIRE(bytes <= buffer_bytes_);
    if (tier != TierKind::kGpu) {
      fill_pattern(address, bytes, seed);
      return checksum(address, bytes);
    }
    Stream& stream = *streams_[s];
    fill_pattern(buffer_->data(), bytes, seed);
    Device& device = runtime_->device();
    REQUIRE(
        device.copy_async(address, buffer_->data(), bytes, CopyKind::kHostToDevice, stream).ok());
    REQUIRE(device.synchronize(stream).ok());  // the buffer is reused next
    return checksum(buffer_->data(), bytes);
  }

  // The checksum of an acquired copy at `address` in `tier`, read in order on stream `s`.
  uint64_t sum(const void* address, TierKind tier, uint64_t bytes, int s = 0) {
    REQUIRE(bytes <= buffer_bytes_);
    if (tier != TierKind::kGpu) return checksum(address, bytes);
    Stream& stream = *streams_[s];
    Device& device = runtime_->device();
    REQUIRE(
        device.copy_async(buffer_->data(), address, bytes, CopyKind::kDeviceToHost, stream).ok());
    REQUIRE(device.synchronize(stream).ok());
    return checksum(buffer_->data(), bytes);
  }

  // Writes `seed`'s pattern through an acquisition in `tier`; returns its checksum.
  uint64_t write(TensorHandle t, uint64_t bytes, uint32_t seed, TierKind tier, int s = 0) {
    auto address = store().acquire(t, tier, *streams_[s], AccessMode::kWrite);
    INFO("acquire for write in " << to_string(tier) << ": " << address.status());
    REQUIRE(address.ok());
    const uint64_t written = fill(*address, tier, bytes, seed, s);
    REQUIRE(store().release(t, *streams_[s]).ok());
    return written;
  }

  // The checksum of what the tensor holds, read through an acquisition in `tier`.
  absl::StatusOr<uint64_t> read(TensorHandle t, uint64_t bytes, TierKind tier, int s = 0) {
    auto address = store().acquire(t, tier, *streams_[s], AccessMode::kRead);
    if (!address.ok()) return address.status();
    const uint64_t got = sum(*address, tier, bytes, s);
    REQUIRE(store().release(t, *streams_[s]).ok());
    return got;
  }

  // True when the tensor read through `tier` has checksum `want`.
  bool holds(TensorHandle t, uint64_t bytes, uint64_t want, TierKind tier, int s = 0) {
    absl::StatusOr<uint64_t> got = read(t, bytes, tier, s);
    if (!got.ok()) {
      UNSCOPED_INFO("read in " << to_string(tier) << " failed: " << got.status());
      return false;
    }
    return *got == want;
  }

 private:
  explicit StoreRig(const StoreVariant& variant) : variant_(variant), dir_("strata-store") {}

  StoreVariant variant_;
  TempDir dir_;
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Stream> streams_[2];
  std::unique_ptr<PinnedHostMemory> buffer_;
  uint64_t buffer_bytes_ = 0;
};

}  // namespace strata::testing

#define STRATA_STORE_CONCAT_INNER(a, b) a##b
#define STRATA_STORE_CONCAT(a, b) STRATA_STORE_CONCAT_INNER(a, b)

// STRATA_STORE_CONFORMANCE("name", "[tags]") { ... uses `const StoreVariant& variant` ... }
// Eight test cases, one per variant; the cuda ones are tagged [cuda] as well.
#define STRATA_STORE_CONFORMANCE(name, tags) \
  STRATA_STORE_CONFORMANCE_IMPL(name, tags,  \
                                STRATA_STORE_CONCAT(strata_store_conformance_, __LINE__))
#define STRATA_STORE_CONFORMANCE_CASE(name, tags, fn, backend, engine, nvme, label)                \
  TEST_CASE(name " (" label ")", tags) {                                                           \
    fn(::strata::testing::StoreVariant{::strata::Backend::backend, ::strata::IoEngineKind::engine, \
                                       nvme});                                                     \
  }
#define STRATA_STORE_CONFORMANCE_IMPL(name, tags, fn)                                              \
  static void fn(const ::strata::testing::StoreVariant& variant);                                  \
  STRATA_STORE_CONFORMANCE_CASE(name, tags, fn, kHost, kIoUring, true, "host, io_uring, nvme")     \
  STRATA_STORE_CONFORMANCE_CASE(name, tags, fn, kHost, kPsync, true, "host, psync, nvme")          \
  STRATA_STORE_CONFORMANCE_CASE(name, tags, fn, kHost, kIoUring, false, "host, io_uring, no nvme") \
  STRATA_STORE_CONFORMANCE_CASE(name, tags, fn, kHost, kPsync, false, "host, psync, no nvme")      \
  STRATA_STORE_CONFORMANCE_CASE(name, tags "[cuda]", fn, kCuda, kIoUring, true,                    \
                                "cuda, io_uring, nvme")                                            \
  STRATA_STORE_CONFORMANCE_CASE(name, tags "[cuda]", fn, kCuda, kPsync, true, "cuda, psync, nvme") \
  STRATA_STORE_CONFORMANCE_CASE(name, tags "[cuda]", fn, kCuda, kIoUring, false,                   \
                                "cuda, io_uring, no nvme")                                         \
  STRATA_STORE_CONFORMANCE_CASE(name, tags "[cuda]", fn, kCuda, kPsync, false,                     \
                                "cuda, psync, no nvme")                                            \
  static void fn([[maybe_unused]] const ::strata::testing::StoreVariant& variant)
