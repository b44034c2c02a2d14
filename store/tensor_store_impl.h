// TensorStore's state, shared by the files that implement it:
//   tensor_store.cc     creation, teardown and the handle table
//   store_access.cc     acquire, release, evict, prefetch and the scheduler calls
//   store_residency.cc  busy events, making a copy resident, write-back
//   store_eviction.cc   room in a tier: victims, eviction, dropping copies
//   store_moves.cc      the bookkeeping around a TierMover move and the completion worker
//   store_flush.cc      flush(): write-backs fanned out over threads
//   store_stats.cc      stats()
//   store_prefetch.cc   background movers
//
// One mutex guards all metadata. Moves run with it released: the destination copy is arriving
// (copy_state.h) and the source copy pinned (a MoveGuard), so no other thread evicts, drops or
// reads half-moved bytes; every thread that meets an arriving copy waits on `changed`. Moves whose
// end the host must observe (write-backs, fetches into the CPU tier) are finished by the completion
// worker, which ends their MoveGuard once the device or the drives say they are done.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "strata/base/mutex.h"
#include "strata/store/copy_state.h"
#include "strata/store/tensor_store.h"
#include "tier_mover.h"

namespace strata {

inline size_t tier_index(TierKind kind) { return static_cast<size_t>(kind); }

// Upcoming accesses a planning round walks, for the read-ahead and the early write-backs (it runs
// under the lock at every acquire: a window of many tiny tensors stops at this many accesses).
inline constexpr size_t kMaxUpcoming = 256;

inline constexpr std::array<TierKind, 3> kTiers = {TierKind::kGpu, TierKind::kCpu, TierKind::kNvme};

struct TensorStore::Impl {
  // Device work that reads or writes a copy, at most one entry per stream: a later record on the
  // same stream covers an earlier one (streams run in order).
  struct Busy {
    const Stream* stream = nullptr;
    std::shared_ptr<Event> event;
  };

  // A tier's copy of a tensor: its state (strata/store/copy_state.h, changed only through its
  // transitions) and the resources it holds.
  struct Copy : CopyStateMachine {
    uint64_t move_id = 0;  // the timeline's id of the last move into it (0: none recorded)
    BlockHandle block;     // gpu / cpu
    ExtentHandle extent;   // nvme
    // Device work that reads or writes this copy; it must finish before the memory is reused,
    // and streams that acquire the copy wait for it. Bounded: one entry per stream, completed
    // entries pruned.
    std::vector<Busy> busy;
  };

  struct Tensor {
    uint32_t index = 0;  // slot in `tensors`
    uint32_t generation = 0;
    bool live = false;
    std::string name;
    uint64_t bytes = 0;
    TierKind home = TierKind::kCpu;
    bool scheduled = true;                  // CreateOptions::scheduled
    Placement placement = Placement::kLow;  // CreateOptions::placement
    std::array<Copy, 3> copies;
    std::vector<std::pair<TierKind, AccessMode>> acquired;  // unreleased acquires, newest last
    uint32_t operations = 0;  // operations in progress that hold a pointer to it
    uint64_t last_use = 0;    // recency tick, for LRU: its last acquire or prefetch
    uint64_t version = 0;     // bumped by every write acquire: a move that started
                              // before it carries older bytes and must not count
  };

  // The bracket around a move, written once: the source is pinned and counted as read, the
  // destination marked moving (not valid), the tensor kept alive. finish() (or destruction, as a
  // failure) ends it under the lock: the destination becomes valid when the move succeeded and no
  // write overtook it.
  class MoveGuard {
   public:
    MoveGuard(Impl& s, Tensor& t, TierKind from, TierKind to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
    MoveGuard(MoveGuard&& other) noexcept;
    MoveGuard& operator=(MoveGuard&&) = delete;
    MoveGuard(const MoveGuard&) = delete;
    ~MoveGuard();  // the lock must be held if still active
    // The move's device reads of the source are issued and their event is in the source's busy
    // list: a write acquisition is ordered after them by that event from now on, and stops
    // waiting for the move (host-side reads, NVMe writes from the CPU tier, still count).
    void issued();
    void finish(bool succeeded);

   private:
    Impl* s_;
    Tensor* t_;
    TierKind from_, to_;
    uint64_t version_;
    bool host_reads_;
    bool reading_ = true;  // counted in the source's `readers`
    bool active_ = true;
  };

  // A move issued and not yet complete, finished by the completion worker.
  struct InFlight {
    InFlight(MoveGuard g, MoveTicket k) : guard(std::move(g)), ticket(std::move(k)) {}
    MoveGuard guard;
    MoveTicket ticket;
    uint32_t index = 0;  // the tensor (kept alive by the guard)
    TierKind from = TierKind::kCpu, to = TierKind::kCpu;
    bool early = false;     // an early write-back (store_early_writeback.cc)
    uint64_t issue_ns = 0;  // host time spent issuing it, counted in MoveStats::ns
    absl::Time issued_at;   // when its issue began (a read's MoveStats::ns runs to its end)
    bool done = false;      // finished: `status` says how (waiters watch `changed`)
    absl::Status status;
    // The timeline (TensorStore::set_timeline): the move's id (0: not recorded), when its issue
    // ended, and the track of the thread that issued it.
    uint64_t trace_id = 0;
    absl::Time issue_end;
    std::string issuer;
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
  std::unique_ptr<TierMover> mover;  // bytes between tiers; its event pool serves releases too

  mutable absl::Mutex mu;
  absl::CondVar changed;  // a copy stopped moving, a pin was dropped, a tensor was released
  std::vector<std::unique_ptr<Tensor>> tensors ABSL_GUARDED_BY(mu);  // stable addresses
  std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, uint32_t> names ABSL_GUARDED_BY(mu);
  AccessSchedule schedule ABSL_GUARDED_BY(mu);
  StoreStats counters ABSL_GUARDED_BY(mu);
  uint64_t tick ABSL_GUARDED_BY(mu) = 0;
  // Copies with busy events, checked when their tier needs room: per tier (gpu, cpu), so that
  // room in one tier never walks the other's.
  std::array<absl::flat_hash_set<uint64_t>, 2> watched ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t>& watched_in(TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return watched[tier == TierKind::kGpu ? 0 : 1];
  }

  // The completion worker: moves in flight and evicted copies waiting for their device work.
  absl::CondVar completion_work;
  std::deque<std::shared_ptr<InFlight>> in_flight ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t> dropping ABSL_GUARDED_BY(mu);  // keys of evicting copies
  bool completion_stopping ABSL_GUARDED_BY(mu) = false;
  std::thread completion_thread;

  // Prefetching.
  absl::CondVar prefetch_work;
  std::deque<std::pair<TensorHandle, TierKind>> prefetch_queue ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t> queued ABSL_GUARDED_BY(mu);  // keys of prefetch_queue
  absl::flat_hash_map<uint64_t, uint64_t> prefetch_limit ABSL_GUARDED_BY(mu);  // key -> distance
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::vector<std::thread> workers;

  // Early write-backs (store_early_writeback.cc): copies queued for one, issued by their own
  // thread (an NVMe write-back may wait for staging), and the bytes in flight.
  absl::CondVar early_work;
  std::deque<std::pair<TensorHandle, TierKind>> early_queue ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t> early_queued ABSL_GUARDED_BY(mu);  // keys of early_queue
  uint64_t early_in_flight_bytes ABSL_GUARDED_BY(mu) = 0;
  std::thread early_writer;

  static uint64_t key(uint32_t index, TierKind tier) {
    return (uint64_t{index} << 2) | tier_index(tier);
  }

  MemoryTier* tier_of(TierKind kind) {
    return kind == TierKind::kGpu ? &gpu : kind == TierKind::kCpu ? &cpu : nullptr;
  }
  bool has_tier(TierKind kind) const { return kind != TierKind::kNvme || nvme != nullptr; }

  // store_timeline.cc: recording into TensorStore::set_timeline's timeline, when one is set.
  std::shared_ptr<Timeline> timeline ABSL_GUARDED_BY(mu);
  // The calling thread waited from `start` to now for `what` of `t`; `ref`: the move waited for.
  void trace_wait(std::string_view what, const Tensor& t, uint64_t ref, absl::Time start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A move, from its issue's start to now (its completion as the store sees it); `io_end`: when
  // its I/O ended (InfinitePast: no host I/O).
  void trace_move(const Tensor& t, TierKind from, TierKind to, uint64_t id, absl::Time start,
                  absl::Time issue_end, absl::Time io_end, const std::string& issuer, bool ok)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void trace_acquire(const Tensor& t, TierKind tier, AccessMode mode, absl::Time start, bool hit,
                     bool late) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // tensor_store.cc
  absl::StatusOr<Tensor*> live(TensorHandle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // store_residency.cc
  void* address(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void update_pin(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops the copy's completed busy entries.
  void prune(Copy& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Adds device work on `stream` to the copy's busy list (replacing the stream's older entry).
  void add_busy(Tensor& t, TierKind tier, const Stream* stream, std::shared_ptr<Event> event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void reap(TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits on the host (lock released) for all device work on the copy.
  absl::Status settle(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes the copy in `tier` valid, fetching it when needed. With `arrive` false (prefetches) it
  // returns once a fetch that ends on the completion worker is under way (the copy is moving).
  // With `unfetched` (kOverwrite) it fetches nothing: once no copy of the tensor is moving or
  // written, it marks the copy valid as it is and sets *unfetched (when it was not valid yet).
  absl::Status make_resident(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond,
                             bool* waited, bool arrive = true, bool* unfetched = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Starts writing the copy in `from` back home; the write-back in flight, or null when there
  // was nothing to write.
  absl::StatusOr<std::shared_ptr<InFlight>> write_back(Tensor& t, TierKind from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<TierKind> newest_copy(const Tensor& t, TierKind dst) const;

  // store_eviction.cc
  absl::Status allocate(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Some copy in `tier` (not `except`'s) is being moved in, read out or evicted right now.
  bool moves_hold(TierKind tier, const Tensor& except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  Tensor* choose_victim(const Tensor& keep, TierKind tier, std::optional<uint64_t> beyond)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A candidate copy's place in the eviction order, the smallest going first: Belady's furthest
  // next use (never used again first), else the least recently used with copies prefetched and
  // not yet used last; ties by the lower id. choose_victim takes the smallest; early write-back
  // walks them in order.
  using EvictionRank = std::tuple<uint64_t, uint64_t, TensorId>;
  EvictionRank eviction_rank(TierKind tier, TensorId id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Starts evicting the copy: its write-back (when it holds the only newest bytes) in flight,
  // or null; the copy goes once that and its device work are done.
  absl::StatusOr<std::shared_ptr<InFlight>> evict_copy(Tensor& t, TierKind tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops an evicting copy now if nothing holds it, else hands it to the completion worker.
  void schedule_drop(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // True when the evicting copy is settled: dropped, or kept for good (rule 1, cancelled).
  bool try_drop(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void cancel_eviction(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void drop_copy(Tensor& t, TierKind tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // store_moves.cc: bytes of `t` from one tier's copy to another's, through the mover, with the
  // lock released while it issues them. Null when the move is complete for every later reader
  // (stream-ordered arrivals on the GPU, NVMe reads the host waited for), else the move in
  // flight, finished by the completion worker.
  absl::StatusOr<std::shared_ptr<InFlight>> start_move(Tensor& t, TierKind from, TierKind to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits until `m` is finished; its status. The caller waits on the move itself (lock
  // released) and finishes it unless the completion worker did first: one hand-off less.
  absl::Status wait_for(InFlight& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits for the copy in `tier`, which is moving, to stop moving: on the move itself when it is
  // in flight (finishing it here, as wait_for does, rather than waiting for the completion worker,
  // which may be blocked on an older move, to see it end), else for `changed`. Records the wait
  // as `what` in the timeline.
  void wait_while_moving(Tensor& t, TierKind tier, std::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void complete(InFlight& m, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void start_completion_worker();
  void stop_completion_worker();
  void run_completion_worker();

  // store_prefetch.cc
  void start_workers();
  void stop_workers();
  void plan_prefetches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  uint64_t read_ahead_bytes() const;  // TensorStoreOptions::read_ahead_bytes, resolved
  // The copy in `tier` must be fetched, and the newest bytes are on NVMe only.
  bool only_on_nvme(const Tensor& t, TierKind tier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void run_worker();

  // store_early_writeback.cc
  uint64_t early_writeback_bytes() const;  // TensorStoreOptions::early_writeback_bytes, resolved
  // Queues early write-backs of the written copies the room for the upcoming accesses
  // (AccessSchedule::upcoming(kMaxUpcoming)) will evict; planned with the prefetches.
  void plan_early_writebacks(const std::vector<DueAccess>& upcoming)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void plan_early_writebacks(TierKind tier, const std::vector<DueAccess>& upcoming)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The copies in `tier` of `candidates`, in the order eviction would take them.
  void order_for_eviction(TierKind tier, std::vector<TensorId>& candidates) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The early write-back reading the copy in `tier`, when one is in flight.
  std::shared_ptr<InFlight> early_writeback_of(const Tensor& t, TierKind tier) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // An early write-back ended (from complete()).
  void early_writeback_done(Tensor& t, InFlight& m, bool succeeded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void start_early_writer();
  void stop_early_writer();
  void run_early_writer();
};

// Keeps a tensor from being destroyed while an operation holds a pointer to it across unlocks.
class OperationGuard {
 public:
  OperationGuard(TensorStore::Impl& impl, TensorStore::Impl::Tensor& t) : impl_(impl), t_(t) {
    ++t_.operations;
  }
  ~OperationGuard() {
    --t_.operations;
    impl_.changed.SignalAll();
  }
  OperationGuard(const OperationGuard&) = delete;
  OperationGuard& operator=(const OperationGuard&) = delete;

 private:
  TensorStore::Impl& impl_;
  TensorStore::Impl::Tensor& t_;
};

}  // namespace strata
