// TensorStore: the tensors a trainer keeps in strata, each with copies in up to three tiers
// (GPU arena, pinned CPU tier, NVMe swap), moved ahead of need by the scheduler.
//
// Data safety (DESIGN.md):
//   1. The newest bytes of a tensor are always in at least one complete copy; a copy is dropped
//      only after another complete, equally new copy exists (write-back observed complete).
//   2. Clean copies are dropped without write-back.
//   3. A failed move leaves the source copy in place and returns an error; the store keeps
//      working.
//   4. An acquired copy is never evicted or moved (its arena block stays pinned, also while work
//      that used it may still be running on a stream).
// Every tensor's home tier holds space reserved at create(), so a write-back never fails for
// lack of room.
//
// Stream ordering: acquire(gpu) makes `stream` wait for the copy's arrival (and for earlier work
// that used the copy) without blocking the host. acquire(cpu) returns host memory the host may
// use at once, so it waits for the copy's device work. release(stream) records where the work
// using the copy ends (one pooled event per stream and copy); the memory is reused only after
// that point. evict() and write-backs to the CPU tier return without waiting for the device
// copy: a completion worker finishes them. Where the host does wait is listed in docs/store.md.
//
// Thread-safe: several trainer threads may create, acquire and release concurrently.
#pragma once

#include <absl/status/statusor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/device/device.h"
#include "strata/nvme/swap_space.h"
#include "strata/store/access_schedule.h"
#include "strata/store/staging.h"
#include "strata/store/tier.h"
#include "strata/store/timeline.h"

namespace strata {

struct TensorHandle {
  uint32_t index = UINT32_MAX;
  uint32_t generation = 0;
  bool valid() const { return index != UINT32_MAX; }
  friend bool operator==(const TensorHandle&, const TensorHandle&) = default;
};

// kRead: the caller reads the copy. kWrite: it reads and writes it (the copy becomes the newest,
// others stale). kOverwrite: it writes every byte before it reads any, so the store fetches
// nothing: where the tier holds no valid copy it allocates one (no move from another tier) and
// ends as kWrite does; where it holds one, kOverwrite is kWrite. The contents are undefined
// until the caller has written them.
enum class AccessMode { kRead, kWrite, kOverwrite };

// kWrite and kOverwrite: the acquisition makes its copy the newest.
inline bool is_write(AccessMode mode) { return mode != AccessMode::kRead; }
inline const char* to_string(AccessMode mode) {
  return mode == AccessMode::kRead ? "read" : mode == AccessMode::kWrite ? "write" : "overwrite";
}

// One acquire of an access order given up front (TensorStore::set_access_plan).
struct OrderedAccess {
  TensorHandle tensor;
  TierKind tier = TierKind::kGpu;
  AccessMode mode = AccessMode::kRead;  // kOverwrite: never prefetched (no bytes are needed)
};

struct TierUsage {
  TierKind kind = TierKind::kGpu;
  bool present = false;  // this store has the tier
  uint64_t capacity = 0;
  uint64_t used = 0;
  uint64_t granularity = 0;  // gpu and cpu: block sizes are rounded up to it (in `used`)
  // The most `used` has been since the store was created or reset_peak_usage() (gpu and cpu;
  // the NVMe tier reports its current use).
  uint64_t peak_used = 0;
  uint64_t resident = 0;  // tensors with a valid copy here
  double fragmentation = 0;
};

struct MoveStats {  // completed moves (counted when seen complete)
  uint64_t bytes = 0;
  uint64_t moves = 0;
  uint64_t ns = 0;  // host time spent issuing them; for reads from NVMe, from issue to their end
};

struct StoreStats {
  std::array<TierUsage, 3> tiers;                 // by TierKind
  std::array<std::array<MoveStats, 3>, 3> moves;  // [from][to]
  uint64_t tensors = 0;
  uint64_t acquires = 0;
  uint64_t hits = 0;    // the copy was there (and valid) when acquired, or needed no bytes
  uint64_t misses = 0;  // fetched on demand
  // kOverwrite acquires that made their copy without fetching the bytes another tier held
  // (counted in hits): the moves a kWrite would have made.
  uint64_t overwrites = 0;
  uint64_t stall_ns = 0;  // host time acquires spent waiting for data
  uint64_t evictions_clean = 0;
  uint64_t evictions_writeback = 0;
  uint64_t errors = 0;  // failed moves
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;    // a prefetched copy was acquired
  uint64_t prefetches_late = 0;    // acquired while still in flight
  uint64_t prefetches_wasted = 0;  // evicted (or overwritten) before any use
  uint64_t prefetches_failed = 0;  // dropped: no room without evicting sooner-needed tensors
  // Device work the copies wait on. Each copy keeps at most one event per stream and drops
  // completed ones, so these stay small however many acquire/release pairs run.
  uint64_t busy_events = 0;      // events the copies hold now
  uint64_t busy_peak = 0;        // the longest busy list any copy has had
  uint64_t events_created = 0;   // device events made; they are pooled and reused
  uint64_t moves_in_flight = 0;  // issued, not yet seen complete (write-backs, fetches to cpu)
  uint64_t drops_pending = 0;    // evicted copies waiting for their device work to end
  // Fetches from NVMe (into either tier) issued and not yet complete, now and the most at once:
  // the drives' queue across tensor boundaries (read-ahead keeps several tensors' reads in
  // flight while one is acquired).
  uint64_t fetches_in_flight = 0;
  uint64_t fetches_in_flight_peak = 0;
  // Early write-backs (TensorStoreOptions::early_writeback_bytes): written copies the coming
  // evictions will take, written home ahead of need while they stay resident. Issued; of those
  // that landed, evicted later without a write-back of their own (used), or written again first
  // (wasted: their bytes crossed the link for nothing).
  uint64_t discards = 0;  // discard() calls: copies made stale without a write-back
  uint64_t early_writebacks = 0;
  uint64_t early_writeback_bytes = 0;
  uint64_t early_writebacks_used = 0;
  uint64_t early_writebacks_wasted = 0;
  double prefetch_accuracy() const {
    return prefetches_issued == 0
               ? 0
               : static_cast<double>(prefetches_used) / static_cast<double>(prefetches_issued);
  }
  AccessScheduleStats schedule;
};

struct TensorStoreOptions {
  bool prefetch = true;           // scheduler-driven prefetching
  bool belady = true;             // false: evict least recently used even with a trace
  uint32_t prefetch_threads = 2;  // background movers
  // Read-ahead: with a trace, every upcoming access within this many bytes of the next ones
  // (counting every access's tensor, fetched or not) whose bytes are only on NVMe is
  // prefetched, due or not, so the drives keep several tensors' reads in flight instead of
  // draining at each tensor boundary. Bounded by room as every prefetch is (it evicts only
  // copies needed later). nullopt: half the staging pool (STRATA_STAGING_BYTES, the pinned
  // budget for NVMe <-> GPU moves in flight; the other half stays for fetches on demand and
  // write-backs), and at most half the GPU tier: a window larger than the tier reads copies for
  // accesses so far ahead that nearer accesses' room evicts them before their use (wasted
  // reads); 0: off (only the schedule's leads).
  std::optional<uint64_t> read_ahead_bytes;
  // Early write-back: with a trace (prefetching on or off), a written copy that the room for the
  // upcoming accesses within this many bytes (counted as read-ahead counts them) will evict is
  // written home ahead of need and stays resident, clean: the acquire that needs the room then
  // drops it instead of waiting for its write-back (which would otherwise sit on the critical
  // path: the eviction is made when the room is needed). The victims are chosen as eviction
  // chooses them (Belady, or LRU with `belady` false), so only bytes the evictions would write
  // anyway cross the link, earlier. nullopt: half the GPU tier's capacity; 0: off.
  std::optional<uint64_t> early_writeback_bytes;
  AccessScheduleOptions schedule;
};

struct CreateOptions {
  // false: the scheduler neither records this tensor's acquires nor prefetches it; its owner
  // moves it (ActivationStash brings activations back in the order backward uses them). The
  // store's eviction then sees it as not needed again, so it goes first when room is short.
  bool scheduled = true;
  // Where its copies go in the GPU and CPU tiers' arenas. kHigh for tensors that live briefly
  // (ActivationStash's activations): at the arenas' top they stay clear of long-lived tensors,
  // which may be pinned (acquired) for a whole step, so their churn does not leave the free
  // space split between pinned blocks.
  Placement placement = Placement::kLow;
};

class TensorStore {
 public:
  // The tiers must outlive the store; `nvme` and `staging` may be null (no NVMe tier).
  static absl::StatusOr<std::unique_ptr<TensorStore>> create(Device& device, MemoryTier& gpu,
                                                             MemoryTier& cpu, SwapSpace* nvme,
                                                             StagingPool* staging,
                                                             TensorStoreOptions options = {});
  ~TensorStore();
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  // Registers a tensor and reserves its home copy. Contents are undefined until first written.
  absl::StatusOr<TensorHandle> create(std::string name, uint64_t bytes, TierKind home,
                                      CreateOptions options = {});
  // Fails while the tensor is acquired; waits for moves in flight.
  absl::Status destroy(TensorHandle tensor);
  absl::StatusOr<TensorHandle> find(std::string_view name) const;
  // What create() was given: the tensor's size in bytes, its name and its home tier.
  struct Info {
    std::string name;
    uint64_t bytes = 0;
    TierKind home = TierKind::kCpu;
  };
  absl::StatusOr<Info> info(TensorHandle tensor) const;

  // The tensor's address in `tier` (gpu or cpu), ready for work issued on `stream` after the
  // call. kWrite makes this copy the newest: other copies become stale. kOverwrite does too,
  // without fetching the bytes: the caller must write every byte before reading any.
  absl::StatusOr<void*> acquire(TensorHandle tensor, TierKind tier, Stream& stream,
                                AccessMode mode);
  // The work on `stream` that used the tensor's most recent acquisition has been issued.
  absl::Status release(TensorHandle tensor, Stream& stream);

  // Starts moving the tensor toward `tier` in the background.
  absl::Status prefetch(TensorHandle tensor, TierKind tier);
  // Drops the copy in `tier`, writing it back home first when it holds the only newest bytes.
  // Returns once the eviction is under way: the copy goes when its write-back and device work
  // are done (an acquire before then keeps it). A write-back to NVMe is waited for, and its
  // failure returned; one to the CPU tier is not (a failure is counted in stats().errors).
  absl::Status evict(TensorHandle tensor, TierKind tier);
  // The tensor's bytes are no longer needed (a saved activation after backward has read it, a
  // gradient after the optimizer step): every copy becomes stale, so eviction drops them without
  // a write-back, and the contents are undefined until the tensor is next written, as after
  // create(). Moves of it in flight land as stale. The scheduler still prefetches its next
  // access unless that is an overwrite. FailedPrecondition while it is acquired.
  absl::Status discard(TensorHandle tensor);
  // Waits until the copy in `tier`, evicted earlier, is gone (its write-back landed and its
  // device work ended). OK also when there is no copy. FailedPrecondition when the copy stays:
  // it was acquired again, or its write-back failed (counted in stats().errors, logged).
  absl::Status wait_evicted(TensorHandle tensor, TierKind tier);
  // Writes every copy newer than its home copy back home, and waits (also for write-backs that
  // evictions left in flight).
  absl::Status flush();

  // The scheduler: step boundaries and an optional order given up front.
  void step_begin();
  void step_end();
  absl::Status set_access_order(const std::vector<std::pair<TensorHandle, TierKind>>& order);
  // The same with each access's mode: the prefetcher fetches nothing for a kOverwrite.
  absl::Status set_access_plan(const std::vector<OrderedAccess>& order);

  StoreStats stats() const;
  // Starts new high-water marks: each tier's peak_used, and fetches_in_flight_peak, become their
  // value now.
  void reset_peak_usage();
  // Keeps `bytes` at the top of the gpu or cpu tier's arena for tensors created with
  // Placement::kHigh: other tensors go below while they fit there (MemoryTier::reserve_high;
  // soft, never a failed allocation). ActivationStash reserves its window this way.
  // InvalidArgument for the nvme tier. Reservations add up; unreserve_high gives one back.
  absl::Status reserve_high(TierKind tier, uint64_t bytes);
  void unreserve_high(TierKind tier, uint64_t bytes);
  // Records every move (issue, I/O, completion), every wait inside the store and every acquire
  // into `timeline` from now on (docs/store.md, "Timeline"); null stops recording. Off by
  // default: recording costs a lock per span.
  void set_timeline(std::shared_ptr<Timeline> timeline);

  struct Impl;
  explicit TensorStore(std::unique_ptr<Impl> impl);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
