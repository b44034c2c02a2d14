// TensorStore's state, shared by tensor_store.cc (API, residency, eviction), store_moves.cc
// (bytes between tiers) and store_prefetch.cc (background movers).
//
// One mutex guards all metadata. Moves run with it released: the destination copy is marked
// `moving` and the source copy pinned, so no other thread evicts, drops or reads half-moved
// bytes; every thread that meets a moving copy waits on `changed`.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/synchronization/mutex.h>

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "strata/mutex.h"
#include "strata/tensor_store.h"

namespace strata {

inline size_t tier_index(TierKind kind) { return static_cast<size_t>(kind); }

// Temporarily releases a held mutex (for I/O and host waits).
class ABSL_SCOPED_LOCKABLE MutexUnlock {
 public:
  explicit MutexUnlock(absl::Mutex* mu) ABSL_UNLOCK_FUNCTION(mu) : mu_(mu) {
    tsan_release(mu_);
    mu_->Unlock();
  }
  ~MutexUnlock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    tsan_acquire(mu_);
  }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  absl::Mutex* const mu_;
};

struct TensorStore::Impl {
  struct Copy {
    bool present = false;      // memory allocated in this tier
    bool valid = false;        // holds the tensor's newest bytes, completely
    bool moving = false;       // bytes are being moved into it: not readable yet
    bool prefetched = false;   // arrived by prefetch, not yet acquired
    bool prefetching = false;  // a prefetch is moving bytes into it right now
    bool arena_pinned = false;
    uint32_t pins = 0;     // acquisitions and moves reading from it
    uint32_t writers = 0;  // write acquisitions not yet released: no move may read it
    uint32_t readers = 0;  // moves reading it now: a write acquisition waits for them
    BlockHandle block;     // gpu / cpu
    ExtentHandle extent;   // nvme
    // Device work that reads or writes this copy; it must finish before the memory is reused,
    // and streams that acquire the copy wait for it.
    std::vector<std::shared_ptr<Event>> busy;
  };

  struct Tensor {
    uint32_t index = 0;  // slot in `tensors`
    uint32_t generation = 0;
    bool live = false;
    std::string name;
    uint64_t bytes = 0;
    TierKind home = TierKind::kCpu;
    std::array<Copy, 3> copies;
    std::vector<std::pair<TierKind, AccessMode>> acquired;  // unreleased acquires, newest last
    uint32_t operations = 0;  // operations in progress that hold a pointer to it
    uint64_t last_use = 0;    // recency tick, for LRU
    uint64_t version = 0;     // bumped by every write acquire: a move that started
                              // before it carries older bytes and must not count
  };

  Impl(Device& d, MemoryTier& g, MemoryTier& c, SwapSpace* n, StagingPool* s, TensorStoreOptions o)
      : device(d),
        gpu(g),
        cpu(c),
        nvme(n),
        staging(s),
        options(std::move(o)),
        schedule(options.schedule) {}

  Device& device;
  MemoryTier& gpu;
  MemoryTier& cpu;
  SwapSpace* const nvme;
  StagingPool* const staging;
  const TensorStoreOptions options;
  std::unique_ptr<Stream> h2d;  // copies toward the GPU
  std::unique_ptr<Stream> d2h;  // copies away from it (full duplex: both directions overlap)

  mutable absl::Mutex mu;
  absl::CondVar changed;  // a copy stopped moving, a pin was dropped, a tensor was released
  std::vector<std::unique_ptr<Tensor>> tensors ABSL_GUARDED_BY(mu);  // stable addresses
  std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, uint32_t> names ABSL_GUARDED_BY(mu);
  AccessSchedule schedule ABSL_GUARDED_BY(mu);
  StoreStats counters ABSL_GUARDED_BY(mu);
  uint64_t tick ABSL_GUARDED_BY(mu) = 0;
  // Copies with busy events, checked when their tier needs room.
  absl::flat_hash_set<uint64_t> watched ABSL_GUARDED_BY(mu);

  // Prefetching.
  absl::CondVar prefetch_work;
  std::deque<std::pair<TensorHandle, TierKind>> prefetch_queue ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t> queued ABSL_GUARDED_BY(mu);  // keys of prefetch_queue
  absl::flat_hash_map<uint64_t, uint64_t> prefetch_limit ABSL_GUARDED_BY(mu);  // key -> distance
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::vector<std::thread> workers;

  static uint64_t key(uint32_t index, TierKind tier) {
    return (uint64_t{index} << 2) | tier_index(tier);
  }

  MemoryTier* tier_of(TierKind kind) {
    return kind == TierKind::kGpu ? &gpu : kind == TierKind::kCpu ? &cpu : nullptr;
  }
  bool has_tier(TierKind kind) const { return kind != TierKind::kNvme || nvme != nullptr; }

  // tensor_store.cc
  absl::StatusOr<Tensor*> live(TensorHandle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void* address(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void update_pin(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void reap(TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status settle(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status allocate(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Some copy in `tier` (not `except`'s) is being moved in or read out by a move.
  bool moves_hold(TierKind tier, const Tensor& except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  Tensor* choose_victim(const Tensor& keep, TierKind tier, std::optional<uint64_t> beyond)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status evict_copy(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void drop_copy(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status make_resident(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond,
                             bool* waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status write_back(Tensor& t, TierKind from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<TierKind> newest_copy(const Tensor& t, TierKind dst) const;

  // store_moves.cc: bytes of `t` from one tier's copy to another's, with the lock released.
  absl::Status transfer(Tensor& t, TierKind from, TierKind to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // store_prefetch.cc
  void start_workers();
  void stop_workers();
  void plan_prefetches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void run_worker();
};

}  // namespace strata
