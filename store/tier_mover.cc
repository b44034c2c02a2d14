#include "tier_mover.h"

#include <absl/strings/str_format.h>

#include <atomic>

#include "strata/base/mutex.h"

namespace strata {

// ---- HostCompletion, MoveTicket -------------------------------------------------------------

void HostCompletion::add_part() {
  MutexLock lock(&mu_);
  ++parts_;
}

void HostCompletion::finish_part(const absl::Status& status) {
  absl::AnyInvocable<absl::Status() &&> last;
  {
    MutexLock lock(&mu_);
    // A private copy: absl::Status shares its message through uninstrumented refcounts.
    if (!status.ok() && status_.ok()) status_ = absl::Status(status.code(), status.message());
    if (parts_ > 1 || !last_) {
      if (--parts_ == 0) {
        done_at_ = absl::Now();
        done_cv_.SignalAll();
      }
      return;
    }
    last = std::move(last_);
  }
  // The last part, with work to run first: outside the lock (it calls into the device), and
  // with the part still counted, so that nobody sees the completion done before it has run.
  const absl::Status ran = std::move(last)();
  MutexLock lock(&mu_);
  if (!ran.ok() && status_.ok()) status_ = absl::Status(ran.code(), ran.message());
  parts_ = 0;
  done_at_ = absl::Now();
  done_cv_.SignalAll();
}

bool HostCompletion::done() const {
  MutexLock lock(&mu_);
  return parts_ == 0;
}

absl::Time HostCompletion::done_at() const {
  MutexLock lock(&mu_);
  return done_at_;
}

absl::Status HostCompletion::wait() const {
  MutexLock lock(&mu_);
  while (parts_ != 0) strata::wait(&done_cv_, &mu_);
  return absl::Status(status_.code(), status_.message());
}

absl::StatusOr<bool> MoveTicket::ready(Device& device) const {
  absl::Status status;
  if (host != nullptr) {
    if (!host->done()) return false;
    status = host->wait();
    if (status.ok() && stream_ordered) return true;
  }
  if (event != nullptr) {
    auto ended = device.query(*event);
    if (!ended.ok()) return ended.status();
    if (!*ended) return false;
  }
  if (!status.ok()) return status;
  return true;
}

absl::Status MoveTicket::wait(Device& device) const {
  absl::Status status;
  if (host != nullptr) status = host->wait();
  if (event != nullptr && !(host != nullptr && stream_ordered && status.ok())) {
    if (auto synced = device.synchronize(*event); status.ok()) status = synced;
  }
  return status;
}

// ---- IoWorker -------------------------------------------------------------------------------

TierMover::IoWorker::IoWorker() : thread_([this] { run(); }) {}

TierMover::IoWorker::~IoWorker() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  thread_.join();
}

void TierMover::IoWorker::post(absl::AnyInvocable<void() &&> work) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
  work_.Signal();
}

void TierMover::IoWorker::run() {
  for (;;) {
    absl::AnyInvocable<void() &&> work;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) wait(&work_, &mu_);
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(work)();
  }
}

// ---- TierMover ------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TierMover>> TierMover::create(Device& device, SwapSpace* swap,
                                                             StagingPool* staging) {
  auto h2d = device.create_stream();
  if (!h2d.ok()) return h2d.status();
  auto d2h = device.create_stream();
  if (!d2h.ok()) return d2h.status();
  return std::make_unique<TierMover>(Key(), device, swap, staging, *std::move(h2d),
                                     *std::move(d2h));
}

TierMover::TierMover(Key, Device& device, SwapSpace* swap, StagingPool* staging,
                     std::unique_ptr<Stream> h2d, std::unique_ptr<Stream> d2h)
    : device_(device),
      swap_(swap),
      staging_(staging),
      h2d_(std::move(h2d)),
      d2h_(std::move(d2h)),
      events_(device),
      io_(std::make_unique<IoWorker>()) {}

TierMover::~TierMover() {
  // Stream callbacks still to run hand work to the I/O worker: let them, then drain it.
  (void)device_.synchronize(*h2d_);
  (void)device_.synchronize(*d2h_);
  io_.reset();
}

absl::Status TierMover::wait_on(Stream& stream, const std::vector<std::shared_ptr<Event>>& after) {
  for (const auto& e : after) {
    if (auto status = device_.wait(stream, *e); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status TierMover::sync_on(const std::vector<std::shared_ptr<Event>>& after) {
  for (const auto& e : after) {
    if (auto status = device_.synchronize(*e); !status.ok()) return status;
  }
  return absl::OkStatus();
}

void TierMover::set_timeline(std::shared_ptr<Timeline> timeline) {
  MutexLock lock(&trace_mu_);
  tracing_.store(timeline != nullptr, std::memory_order_relaxed);
  timeline_ = std::move(timeline);
}

std::shared_ptr<Timeline> TierMover::timeline() const {
  if (!tracing_.load(std::memory_order_relaxed)) return nullptr;  // no lock when not recording
  MutexLock lock(&trace_mu_);
  return timeline_;
}

StagingPool::Lease TierMover::lease(uint64_t bytes, const std::shared_ptr<Timeline>& timeline,
                                    uint64_t trace_id) {
  if (timeline == nullptr) return staging_->acquire(bytes);
  const int64_t start = timeline->now_ns();
  StagingPool::Lease lease = staging_->acquire(bytes);
  const int64_t end = timeline->now_ns();
  constexpr int64_t kWaited = 20'000;  // below this it took what was free
  if (end - start >= kWaited) {
    timeline->add(Timeline::Span{Timeline::thread_track(),
                                 "staging",
                                 "wait",
                                 start,
                                 end,
                                 0,
                                 trace_id,
                                 {Timeline::Arg::num("bytes", static_cast<double>(bytes))}});
  }
  return lease;
}

namespace {

// A chunk's read or write, from its submission to its callback.
void chunk_span(const std::shared_ptr<Timeline>& timeline, const char* track, uint64_t trace_id,
                uint64_t offset, uint64_t bytes, int64_t start, int64_t queued_ns = 0) {
  if (timeline == nullptr) return;
  std::vector<Timeline::Arg> args = {Timeline::Arg::num("offset", static_cast<double>(offset)),
                                     Timeline::Arg::num("bytes", static_cast<double>(bytes))};
  if (queued_ns > 0)
    args.push_back(Timeline::Arg::num("queued_us", static_cast<double>(queued_ns) * 1e-3));
  timeline->add(Timeline::Span{track, absl::StrFormat("chunk @%d", offset), "io", start,
                               timeline->now_ns(), 0, trace_id, std::move(args)});
}

}  // namespace

uint64_t TierMover::piece_bytes(uint64_t bytes) const {
  const uint64_t stripe = swap_->stripe_bytes();
  const uint64_t quarter = (bytes + kPieces - 1) / kPieces;
  const uint64_t piece = std::max(stripe, (quarter + stripe - 1) / stripe * stripe);
  return std::min(staging_->chunk_bytes(), piece);
}

absl::Status TierMover::traced_copy(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                                    Stream& stream, const std::shared_ptr<Timeline>& timeline,
                                    uint64_t trace_id) {
  if (timeline == nullptr) return device_.copy_async(dst, src, bytes, kind, stream);
  // Stamped by the stream itself, before and after the copy: when the link carried it.
  auto started = std::make_shared<std::atomic<int64_t>>(0);
  if (auto status = device_.launch_host_callback(
          stream, [timeline, started] { started->store(timeline->now_ns()); });
      !status.ok()) {
    return status;
  }
  if (auto status = device_.copy_async(dst, src, bytes, kind, stream); !status.ok()) return status;
  const char* track = kind == CopyKind::kHostToDevice ? "h2d link" : "d2h link";
  return device_.launch_host_callback(stream, [timeline, started, track, bytes, trace_id] {
    timeline->add(Timeline::Span{track,
                                 "copy",
                                 "copy",
                                 started->load(),
                                 timeline->now_ns(),
                                 0,
                                 trace_id,
                                 {Timeline::Arg::num("bytes", static_cast<double>(bytes))}});
  });
}

absl::StatusOr<MoveTicket> TierMover::move(const Place& from, const Place& to, uint64_t bytes,
                                           const std::vector<std::shared_ptr<Event>>& after,
                                           uint64_t trace_id) {
  const TierKind a = from.tier;
  const TierKind b = to.tier;
  if ((a == TierKind::kNvme || b == TierKind::kNvme) && (swap_ == nullptr || staging_ == nullptr)) {
    return absl::FailedPreconditionError("no NVMe tier: set STRATA_NVME_PATHS");
  }
  const auto copy = [&](Stream& stream, CopyKind kind) -> absl::StatusOr<MoveTicket> {
    if (auto status = wait_on(stream, after); !status.ok()) return status;
    if (auto status =
            traced_copy(to.address, from.address, bytes, kind, stream, timeline(), trace_id);
        !status.ok()) {
      return status;
    }
    auto event = events_.record(stream);
    if (!event.ok()) return event.status();
    return MoveTicket{*std::move(event), &stream, nullptr};
  };
  if (a == TierKind::kCpu && b == TierKind::kGpu) return copy(*h2d_, CopyKind::kHostToDevice);
  if (a == TierKind::kGpu && b == TierKind::kCpu) return copy(*d2h_, CopyKind::kDeviceToHost);
  if (a == TierKind::kNvme && b == TierKind::kCpu) {
    // The host waits for earlier device work on the block: the drives write it, not a stream.
    if (auto status = sync_on(after); !status.ok()) return status;
    return nvme_to_cpu(from, to, bytes);
  }
  if (a == TierKind::kCpu && b == TierKind::kNvme) return cpu_to_nvme(from, to, bytes);
  if (a == TierKind::kNvme && b == TierKind::kGpu) {
    if (auto status = wait_on(*h2d_, after); !status.ok()) return status;
    return nvme_to_gpu(from, to, bytes, trace_id);
  }
  if (a == TierKind::kGpu && b == TierKind::kNvme) {
    if (auto status = wait_on(*d2h_, after); !status.ok()) return status;
    return gpu_to_nvme(from, to, bytes, trace_id);
  }
  return absl::InternalError(absl::StrFormat("no move from %s to %s", to_string(a), to_string(b)));
}

absl::StatusOr<MoveTicket> TierMover::cpu_to_nvme(const Place& from, const Place& to,
                                                  uint64_t bytes) {
  auto host = std::make_shared<HostCompletion>();
  host->add_part();
  // The write hashes on this thread (never a stream callback) and completes on an I/O thread.
  auto status = swap_->write(to.extent, 0, from.address, bytes,
                             [host](absl::Status written) { host->finish_part(written); });
  if (!status.ok()) host->finish_part(status);  // `done` is not called for a refused request
  host->finish_part(absl::OkStatus());
  return MoveTicket{nullptr, nullptr, std::move(host)};
}

absl::StatusOr<MoveTicket> TierMover::nvme_to_cpu(const Place& from, const Place& to,
                                                  uint64_t bytes) {
  auto host = std::make_shared<HostCompletion>();
  host->add_part();
  if (auto status = swap_->read(from.extent, 0, to.address, bytes,
                                [host](absl::Status read) { host->finish_part(read); });
      !status.ok()) {
    return status;  // refused: nothing runs, `done` is not called
  }
  host->finish_part(absl::OkStatus());
  return MoveTicket{nullptr, nullptr, std::move(host)};
}

absl::StatusOr<MoveTicket> TierMover::nvme_to_gpu(const Place& from, const Place& to,
                                                  uint64_t bytes, uint64_t trace_id) {
  const std::shared_ptr<Timeline> trace = timeline();
  // The arrival event is taken now and recorded once the last chunk's copy is queued: by the
  // thread that finishes the move's last part (a read's callback, or this one).
  auto event = events_.take();
  if (!event.ok()) return event.status();
  auto host =
      std::make_shared<HostCompletion>([this, e = *event]() { return device_.record(*e, *h2d_); });
  auto* dst = static_cast<std::byte*>(to.address);
  absl::Status issued;
  const uint64_t piece = piece_bytes(bytes);
  for (uint64_t offset = 0; offset < bytes && issued.ok(); offset += piece) {
    const uint64_t n = std::min(piece, bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(this->lease(n, trace, trace_id));
    std::byte* chunk = static_cast<std::byte*>(lease->data());
    host->add_part();
    const int64_t submitted = trace != nullptr ? trace->now_ns() : 0;
    issued = swap_->read(from.extent, offset, chunk, n,
                         [this, host, lease, chunk, target = dst + offset, n, trace, trace_id,
                          offset, submitted](absl::Status read) {
                           chunk_span(trace, "nvme read", trace_id, offset, n, submitted);
                           if (read.ok()) {
                             read = traced_copy(target, chunk, n, CopyKind::kHostToDevice, *h2d_,
                                                trace, trace_id);
                           }
                           // The chunk goes back to the pool once its H2D copy has run.
                           if (read.ok()) read = device_.launch_host_callback(*h2d_, [lease] {});
                           host->finish_part(read);
                         });
    if (!issued.ok()) host->finish_part(issued);  // this chunk's part: `done` will not run
  }
  // A refused read fails the move when the completion is seen: what was issued still runs.
  host->finish_part(absl::OkStatus());
  return MoveTicket{*std::move(event), h2d_.get(), std::move(host), /*stream_ordered=*/true};
}

absl::StatusOr<MoveTicket> TierMover::gpu_to_nvme(const Place& from, const Place& to,
                                                  uint64_t bytes, uint64_t trace_id) {
  const std::shared_ptr<Timeline> trace = timeline();
  auto host = std::make_shared<HostCompletion>();
  const auto* src = static_cast<const std::byte*>(from.address);
  absl::Status issued;
  const uint64_t piece = piece_bytes(bytes);
  for (uint64_t offset = 0; offset < bytes; offset += piece) {
    const uint64_t n = std::min(piece, bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(this->lease(n, trace, trace_id));
    std::byte* chunk = static_cast<std::byte*>(lease->data());
    issued = traced_copy(chunk, src + offset, n, CopyKind::kDeviceToHost, *d2h_, trace, trace_id);
    if (!issued.ok()) break;
    host->add_part();
    // The callback only hands the write to the I/O worker: the write hashes its units, which
    // must not hold up the copy stream behind it.
    issued = device_.launch_host_callback(*d2h_, [this, extent = to.extent, offset, chunk, n, lease,
                                                  host, trace, trace_id]() mutable {
      // The chunk's span runs from its D2H copy's end (posted) to its write's end.
      const int64_t posted = trace != nullptr ? trace->now_ns() : 0;
      io_->post([swap = swap_, extent, offset, chunk, n, lease = std::move(lease),
                 host = std::move(host), trace, trace_id, posted]() mutable {
        const int64_t queued = trace != nullptr ? trace->now_ns() - posted : 0;
        auto submitted = swap->write(
            extent, offset, chunk, n,
            [lease, host, trace, trace_id, offset, n, posted, queued](absl::Status written) {
              chunk_span(trace, "nvme write", trace_id, offset, n, posted, queued);
              host->finish_part(written);
            });
        if (!submitted.ok()) host->finish_part(submitted);
      });
    });
    if (!issued.ok()) {
      host->finish_part(issued);  // this chunk's part: its callback will never run
      break;
    }
  }
  // The D2H copies' end: the source may be written again only after it.
  absl::StatusOr<std::shared_ptr<Event>> event = events_.record(*d2h_);
  if (issued.ok() && !event.ok()) issued = event.status();
  host->finish_part(issued);
  return MoveTicket{event.ok() ? *std::move(event) : nullptr, d2h_.get(), std::move(host)};
}

}  // namespace strata
