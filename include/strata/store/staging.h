// StagingPool: the fixed budget (STRATA_STAGING_BYTES) of pinned bounce buffers that NVMe <-> GPU
// moves pass through. It is one pinned block of the CPU tier cut into equal chunks; a move
// leases chunks and returns them when done. When every chunk is leased, acquire() waits: no
// amount of NVMe traffic grows pinned memory past the budget.
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "strata/store/tier.h"

namespace strata {

struct StagingStats {
  uint64_t chunk_bytes = 0;
  uint64_t chunks = 0;
  uint64_t in_use = 0;
  uint64_t peak_in_use = 0;
  uint64_t leases = 0;
  uint64_t waits = 0;  // acquires that found every chunk busy
  uint64_t wait_ns = 0;
};

class StagingPool {
 public:
  // Carves `bytes` (rounded down to whole chunks, at least one) out of `cpu_tier`, pinned there
  // for the pool's life. `chunk_bytes` must be a multiple of 4096.
  static absl::StatusOr<std::unique_ptr<StagingPool>> create(MemoryTier& cpu_tier, uint64_t bytes,
                                                             uint64_t chunk_bytes);
  class Key {  // passkey: only create() constructs pools
    friend class StagingPool;
    Key() = default;
  };
  StagingPool(Key, MemoryTier& tier, BlockHandle block, std::byte* base, uint64_t chunk_bytes,
              uint64_t chunks);
  // Waits for every lease to come back, then returns the memory to the CPU tier.
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // One leased chunk; returned to the pool on destruction.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease();
    void* data() const { return data_; }
    uint64_t bytes() const { return bytes_; }
    explicit operator bool() const { return pool_ != nullptr; }

   private:
    friend class StagingPool;
    Lease(StagingPool* pool, uint32_t chunk, void* data, uint64_t bytes)
        : pool_(pool), chunk_(chunk), data_(data), bytes_(bytes) {}
    void release();
    StagingPool* pool_ = nullptr;
    uint32_t chunk_ = 0;
    void* data_ = nullptr;
    uint64_t bytes_ = 0;
  };

  Lease acquire();                     // waits for a free chunk
  std::optional<Lease> try_acquire();  // nullopt when all are busy
  std::optional<Lease> acquire_for(absl::Duration timeout);

  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks() const { return chunk_count_; }
  StagingStats stats() const;

 private:
  Lease take_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void give_back(uint32_t chunk);

  MemoryTier& tier_;
  const BlockHandle block_;
  std::byte* const base_;
  const uint64_t chunk_bytes_;
  const uint64_t chunk_count_;
  mutable absl::Mutex mu_;
  absl::CondVar freed_;
  std::vector<uint32_t> free_chunks_ ABSL_GUARDED_BY(mu_);
  StagingStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata
