// TierMover: moves bytes from one tier's place to another's. It is built from the device, its
// two copy streams, the swap space and the staging pool, and knows nothing of tensors, copies or
// the store's lock: the store decides what moves and keeps the bookkeeping; the mover moves.
//
//   cpu -> gpu   H2D on the h2d stream after `after`; returns at once.
//   gpu -> cpu   D2H on the d2h stream after `after`; returns at once.
//   nvme -> cpu  swap read straight into the pinned CPU-tier block; returns once submitted.
//   cpu -> nvme  swap write straight from it; returns once submitted.
//   nvme -> gpu  through staging chunks (pieces of at most a chunk, at least kPieces per move when
//                the tensor has that many stripe units), pipelined: each chunk's H2D is queued as
//                its read lands (reads of later chunks overlap it); returns once every read is
//                submitted (it waits only for free staging). The move is complete for readers when
//                its reads are: the event recorded after the last chunk's copy orders them.
//   gpu -> nvme  through staging chunks: D2H of chunk k, then its swap write handed to the
//                mover's I/O worker (hashing never runs on a stream callback), overlapping the D2H
//                of k+1; returns once every chunk is issued (it waits only for free staging).
//
// Every move returns a MoveTicket: the device event that ends its stream work (if any) and the
// host completion of its I/O (if any). A move is complete when both are.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "event_pool.h"
#include "strata/device/device.h"
#include "strata/nvme/swap_space.h"
#include "strata/store/staging.h"
#include "strata/store/tier.h"
#include "strata/store/timeline.h"

namespace strata {

// Where bytes are: an address in the GPU arena or the CPU tier, or an NVMe extent.
struct Place {
  TierKind tier = TierKind::kCpu;
  void* address = nullptr;  // gpu / cpu
  ExtentHandle extent;      // nvme
};

// The host side of a move that ends in I/O: done once its last part is.
class HostCompletion {
 public:
  // Starts with one part: the issuer's, ended by finish_part() when issuing is over. `last`, if
  // given, runs on the thread that finishes the last part, before anyone sees the completion
  // done; its error becomes the completion's (nvme -> gpu records its event there).
  explicit HostCompletion(absl::AnyInvocable<absl::Status() &&> last = nullptr)
      : last_(std::move(last)) {}
  void add_part();
  void finish_part(const absl::Status& status);  // keeps the first error
  bool done() const;
  absl::Status wait() const;   // blocks until done; the first error
  absl::Time done_at() const;  // when the last part finished; InfinitePast until then

 private:
  mutable absl::Mutex mu_;
  mutable absl::CondVar done_cv_;
  uint64_t parts_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::AnyInvocable<absl::Status() &&> last_ ABSL_GUARDED_BY(mu_);
  absl::Time done_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

struct MoveTicket {
  std::shared_ptr<Event> event;          // end of the move's stream work; null when none
  const Stream* stream = nullptr;        // the stream `event` was recorded on
  std::shared_ptr<HostCompletion> host;  // end of its I/O; null when none
  // With both: once `host` is done (and succeeded) the move is complete for work ordered after
  // `event` (an arrival on the GPU); else it is complete when both are.
  bool stream_ordered = false;
  // True once the move is complete (an error if it failed), without blocking. A failed move is
  // reported only once its stream work has ended too, so its memory may be reused at once.
  absl::StatusOr<bool> ready(Device& device) const;
  // Blocks until the move is complete; its error, if any.
  absl::Status wait(Device& device) const;
};

class TierMover {
 public:
  // `swap` and `staging` may be null (no NVMe tier).
  static absl::StatusOr<std::unique_ptr<TierMover>> create(Device& device, SwapSpace* swap,
                                                           StagingPool* staging);
  // Waits for every move it issued to finish with its buffers (staging chunks, I/O).
  ~TierMover();
  TierMover(const TierMover&) = delete;
  TierMover& operator=(const TierMover&) = delete;

  // Moves `bytes` from `from` to `to`, after the device work in `after` (work that must finish
  // before either place is read or written). Neither place may change until the ticket is
  // complete. An error means nothing was issued that still runs, or that what ran failed.
  // `trace_id`: the move's id in the timeline (set_timeline), which its chunks' spans refer to.
  absl::StatusOr<MoveTicket> move(const Place& from, const Place& to, uint64_t bytes,
                                  const std::vector<std::shared_ptr<Event>>& after,
                                  uint64_t trace_id = 0);

  // Records each NVMe chunk's read or write (submitted to done) and each wait for staging into
  // `timeline` (null: stop). TensorStore::set_timeline sets it.
  void set_timeline(std::shared_ptr<Timeline> timeline);

  Device& device() const { return device_; }
  EventPool& events() { return events_; }

  struct Key {  // passkey: use create()
   private:
    friend class TierMover;
    Key() = default;
  };
  TierMover(Key, Device& device, SwapSpace* swap, StagingPool* staging, std::unique_ptr<Stream> h2d,
            std::unique_ptr<Stream> d2h);

 private:
  // A thread that runs I/O submissions handed over from stream callbacks.
  class IoWorker {
   public:
    IoWorker();
    ~IoWorker();  // runs what is queued, then stops
    void post(absl::AnyInvocable<void() &&> work);

   private:
    void run();
    absl::Mutex mu_;
    absl::CondVar work_;
    std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
    bool stopping_ ABSL_GUARDED_BY(mu_) = false;
    std::thread thread_;  // last: starts after the members it uses
  };

  absl::Status wait_on(Stream& stream, const std::vector<std::shared_ptr<Event>>& after);
  absl::Status sync_on(const std::vector<std::shared_ptr<Event>>& after);
  absl::StatusOr<MoveTicket> nvme_to_cpu(const Place& from, const Place& to, uint64_t bytes);
  absl::StatusOr<MoveTicket> nvme_to_gpu(const Place& from, const Place& to, uint64_t bytes,
                                         uint64_t trace_id);
  absl::StatusOr<MoveTicket> gpu_to_nvme(const Place& from, const Place& to, uint64_t bytes,
                                         uint64_t trace_id);
  std::shared_ptr<Timeline> timeline() const;
  // The pieces an NVMe <-> GPU move of `bytes` goes in: at most a staging chunk, and small enough
  // that the move has kPieces of them (whole stripe units, so at least one unit), so that the
  // H2D copy of one piece overlaps the read of the next even for a tensor smaller than a chunk
  // (an 8 MiB weight in the 32 MiB chunks of the default 256 MiB staging used to be read whole,
  // then copied whole: issue 26's timeline showed the compute stream waiting on those copies).
  static constexpr uint64_t kPieces = 4;
  uint64_t piece_bytes(uint64_t bytes) const;
  // copy_async; with `timeline`, stamped by the stream before and after, so that the trace shows
  // when the link carried it (track "h2d link" / "d2h link", `trace_id` its move).
  absl::Status traced_copy(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                           Stream& stream, const std::shared_ptr<Timeline>& timeline,
                           uint64_t trace_id);
  // A staging lease of `bytes`; a wait for it goes into `timeline` (when set) as a span.
  StagingPool::Lease lease(uint64_t bytes, const std::shared_ptr<Timeline>& timeline,
                           uint64_t trace_id);
  absl::StatusOr<MoveTicket> cpu_to_nvme(const Place& from, const Place& to, uint64_t bytes);

  Device& device_;
  SwapSpace* const swap_;
  StagingPool* const staging_;
  const std::unique_ptr<Stream> h2d_;  // copies toward the GPU
  const std::unique_ptr<Stream> d2h_;  // copies away from it (full duplex: both overlap)
  EventPool events_;
  std::atomic<bool> tracing_{false};  // timeline_ is set: read without the lock
  mutable absl::Mutex trace_mu_;
  std::shared_ptr<Timeline> timeline_ ABSL_GUARDED_BY(trace_mu_);
  // Declared last: destroyed first, after the destructor has drained the streams.
  std::unique_ptr<IoWorker> io_;
};

}  // namespace strata
