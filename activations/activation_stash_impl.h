// ActivationStash's state, shared by its two files:
//   activation_stash.cc   the trainer's calls (allocate, offload, load, unload, free, steps)
//   activation_moves.cc   the GPU window, prefetch planning, and the two background threads:
//                         the mover (activations home, freed ones destroyed) and the fetcher
//                         (prefetched activations into the GPU tier)
//
// Each activation is a store tensor homed in the stash's home tier, created unscheduled (the
// stash, not the store's scheduler, decides when it comes back). The window is the stash's own
// count of GPU-tier bytes: an activation counts from the moment it is allocated or planned for a
// fetch until a background thread has seen its GPU copy gone (moved home, destroyed, or the
// fetch cancelled before it started), so the count is never below what the GPU tier holds for
// activations. The fetcher is the stash's own (not the store's prefetch queue) so that a fetch
// can be cancelled or waited for before its activation is sent home again.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "activation_order.h"
#include "strata/activations/activation_stash.h"
#include "strata/base/mutex.h"

namespace strata {

namespace activation_detail {

enum class Phase {
  kWriting,  // allocated: the trainer writes it
  kMoving,   // a background move home is queued or running
  kHome,     // its newest bytes are home (a GPU copy may have come back since)
  kKept,     // offloaded, but kept in the GPU tier for backward (keep_tail)
};

absl::Status annotate(const absl::Status& status, const std::string& what);

}  // namespace activation_detail

struct ActivationStash::Impl {
  using Phase = activation_detail::Phase;

  struct Entry {
    ActivationId id = 0;
    TensorHandle tensor;
    std::string name;
    uint64_t bytes = 0;
    // What it takes of the GPU tier: `bytes` rounded up to the arena's granularity. The window
    // counts this, so that window_bytes bounds the tier's bytes and not only the trainer's.
    uint64_t footprint = 0;
    uint64_t step = 0;
    uint32_t save_index = 0;
    TierKind written = TierKind::kGpu;  // the tier allocate() handed out
    Phase phase = Phase::kWriting;
    bool on_gpu = false;      // counted in the window
    bool prefetched = false;  // planned for a fetch, not loaded since
    bool fetch_queued = false;
    bool fetching = false;  // the fetcher works on it now
    bool freed = false;
    bool destroying = false;  // its destroy job is queued or running
    uint32_t loads = 0;       // loads not yet given back
    uint32_t releasing = 0;   // calls working on it with the lock dropped
    absl::Status error;       // its failed move home
  };
  enum class JobKind { kMoveHome, kDestroy };
  struct Job {
    JobKind kind;
    Entry* entry;
  };

  Impl(TensorStore& s, Device& d, ActivationStashOptions o, uint64_t granularity,
       std::unique_ptr<Stream> own, std::unique_ptr<Stream> fetch)
      : store(s),
        device(d),
        options(std::move(o)),
        gpu_granularity(granularity),
        own_stream(std::move(own)),
        fetch_stream(std::move(fetch)) {}

  TensorStore& store;
  Device& device;
  const ActivationStashOptions options;
  const uint64_t gpu_granularity;              // the GPU arena rounds block sizes up to this
  const std::unique_ptr<Stream> own_stream;    // releases the trainer left at destruction
  const std::unique_ptr<Stream> fetch_stream;  // the fetcher's copies into the GPU tier

  mutable absl::Mutex mu;
  absl::CondVar changed;     // a job or a fetch finished
  absl::CondVar work;        // a job was queued, or the threads must stop
  absl::CondVar fetch_work;  // a fetch was queued, or the threads must stop
  absl::flat_hash_map<ActivationId, std::unique_ptr<Entry>> entries ABSL_GUARDED_BY(mu);
  std::deque<Job> jobs ABSL_GUARDED_BY(mu);
  std::deque<Entry*> fetches ABSL_GUARDED_BY(mu);
  uint32_t running ABSL_GUARDED_BY(mu) = 0;          // jobs taken by the mover, not finished
  uint32_t fetching ABSL_GUARDED_BY(mu) = 0;         // fetches the fetcher works on (0 or 1)
  uint64_t pending_gpu ABSL_GUARDED_BY(mu) = 0;      // window bytes queued jobs will give back
  uint64_t background_done ABSL_GUARDED_BY(mu) = 0;  // jobs and fetches finished, ever
  bool stopping ABSL_GUARDED_BY(mu) = false;
  ActivationId next_id ABSL_GUARDED_BY(mu) = 1;
  uint64_t step ABSL_GUARDED_BY(mu) = 0;
  std::vector<ActivationId> step_saves ABSL_GUARDED_BY(mu);  // by save index; 0 once freed
  uint64_t kept_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t last_load_step ABSL_GUARDED_BY(mu) = UINT64_MAX;  // the latest load's step and index
  uint32_t last_load_index ABSL_GUARDED_BY(mu) = 0;
  bool window_cut ABSL_GUARDED_BY(mu) = false;  // the latest plan stopped at the window
  ActivationOrder order ABSL_GUARDED_BY(mu);
  ActivationStashStats counters ABSL_GUARDED_BY(mu);
  absl::Status first_error ABSL_GUARDED_BY(mu);
  std::vector<std::string> trace ABSL_GUARDED_BY(mu);
  std::thread mover;
  std::thread fetcher;

  absl::StatusOr<Entry*> find(ActivationId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void count_in(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void count_out(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void record_error(Entry& e, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void queue(JobKind kind, Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Destroys a freed entry once nothing holds it: no call, move or fetch working on it.
  void destroy_when_idle(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops a queued fetch that has not started (its bytes leave the window at once); true when
  // there was one.
  bool cancel_fetch(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Gives `times` of e's store acquisitions back on `stream`, with the lock dropped meanwhile;
  // the first error.
  absl::Status release(Entry& e, Stream& stream, uint32_t times) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits until the fetcher is done with `e`.
  void wait_fetch(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Waits until `bytes` more fit in the window: for queued moves, destroys and fetches to give
  // bytes back, sending kept and prefetched activations home when nothing else would.
  absl::Status make_room(uint64_t bytes, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Sends one kept or prefetched (not loaded) activation home; false when there is none.
  bool reclaim_one() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::string window_breakdown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Queues fetches of the activations backward uses after (from_step, from_index), up to
  // prefetch_bytes ahead and within the window. A plan the window cut short is planned again
  // when bytes come back (from the latest load), so a tight window delays prefetches rather
  // than dropping them.
  void plan_prefetch(uint64_t from_step, uint32_t from_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Counts `e` into the window and queues its fetch.
  void fetch(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void close_step() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void run_mover();
  void run_fetcher();
};

}  // namespace strata
