// StagingPool: the fixed budget (STRATA_STAGING_BYTES) of pinned bounce buffers that NVMe <-> GPU
// moves pass through. It is one pinned block of the CPU tier; a move leases pieces of it, at most
// a chunk each (the size a move pipelines in), sized to what it carries: a 1 MiB tensor takes
// 1 MiB, not a whole chunk, so many small tensors' moves are in flight at once. When the budget
// is taken, acquire() waits, first come first served: no amount of NVMe traffic grows pinned
// memory past the budget, and a chunk-sized request is not starved by small ones.
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "strata/allocator/arena.h"
#include "strata/store/tier.h"

namespace strata {

struct StagingStats {
  uint64_t chunk_bytes = 0;  // the largest lease
  uint64_t chunks = 0;       // the budget in chunks
  uint64_t bytes = 0;        // the budget: chunks x chunk_bytes
  uint64_t in_use = 0;       // leases held now
  uint64_t peak_in_use = 0;  // the most held at once (since creation or reset_peak())
  uint64_t in_use_bytes = 0;
  uint64_t peak_in_use_bytes = 0;
  uint64_t leases = 0;
  uint64_t waits = 0;  // acquires that could not take their lease at once
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
              uint64_t chunks, Arena pieces);
  // Waits for every lease to come back, then returns the memory to the CPU tier.
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // One leased piece, 4096-aligned; returned to the pool on destruction.
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
    Lease(StagingPool* pool, BlockHandle piece, void* data, uint64_t bytes)
        : pool_(pool), piece_(piece), data_(data), bytes_(bytes) {}
    void release();
    StagingPool* pool_ = nullptr;
    BlockHandle piece_;
    void* data_ = nullptr;
    uint64_t bytes_ = 0;
  };

  Lease acquire();                     // a whole chunk; waits for room
  Lease acquire(uint64_t bytes);       // min(bytes, chunk) rounded up to 4096; waits for room
  std::optional<Lease> try_acquire();  // a whole chunk; nullopt when there is no room now
  std::optional<Lease> acquire_for(absl::Duration timeout);  // a whole chunk

  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks() const { return chunk_count_; }
  uint64_t bytes() const { return chunk_bytes_ * chunk_count_; }
  StagingStats stats() const;
  // Starts new high-water marks: the peaks become what is held now.
  void reset_peak();

 private:
  // A lease of `bytes`: at once when nobody waits and it fits; else (with `wait`) in turn, until
  // `deadline` if one is given.
  std::optional<Lease> take(uint64_t bytes, bool wait, std::optional<absl::Time> deadline);
  std::optional<Lease> take_now(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void give_back(BlockHandle piece, uint64_t bytes);

  MemoryTier& tier_;
  const BlockHandle block_;
  std::byte* const base_;
  const uint64_t chunk_bytes_;
  const uint64_t chunk_count_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;                           // a lease came back, or a waiter left the line
  Arena pieces_ ABSL_GUARDED_BY(mu_);               // offsets in [0, bytes())
  std::deque<uint64_t> line_ ABSL_GUARDED_BY(mu_);  // waiting acquires, first served first
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 0;
  StagingStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata
