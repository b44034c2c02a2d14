#include "tier_mover.h"

#include <absl/strings/str_format.h>

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
      if (--parts_ == 0) done_cv_.SignalAll();
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
  done_cv_.SignalAll();
}

bool HostCompletion::done() const {
  MutexLock lock(&mu_);
  return parts_ == 0;
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

absl::StatusOr<MoveTicket> TierMover::move(const Place& from, const Place& to, uint64_t bytes,
                                           const std::vector<std::shared_ptr<Event>>& after) {
  const TierKind a = from.tier;
  const TierKind b = to.tier;
  if ((a == TierKind::kNvme || b == TierKind::kNvme) && (swap_ == nullptr || staging_ == nullptr)) {
    return absl::FailedPreconditionError("no NVMe tier: set STRATA_NVME_PATHS");
  }
  const auto copy = [&](Stream& stream, CopyKind kind) -> absl::StatusOr<MoveTicket> {
    if (auto status = wait_on(stream, after); !status.ok()) return status;
    if (auto status = device_.copy_async(to.address, from.address, bytes, kind, stream);
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
    return nvme_to_gpu(from, to, bytes);
  }
  if (a == TierKind::kGpu && b == TierKind::kNvme) {
    if (auto status = wait_on(*d2h_, after); !status.ok()) return status;
    return gpu_to_nvme(from, to, bytes);
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
                                                  uint64_t bytes) {
  // The arrival event is taken now and recorded once the last chunk's copy is queued: by the
  // thread that finishes the move's last part (a read's callback, or this one).
  auto event = events_.take();
  if (!event.ok()) return event.status();
  auto host =
      std::make_shared<HostCompletion>([this, e = *event]() { return device_.record(*e, *h2d_); });
  auto* dst = static_cast<std::byte*>(to.address);
  absl::Status issued;
  for (uint64_t offset = 0; offset < bytes && issued.ok(); offset += staging_->chunk_bytes()) {
    const uint64_t n = std::min(staging_->chunk_bytes(), bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(staging_->acquire(n));
    std::byte* chunk = static_cast<std::byte*>(lease->data());
    host->add_part();
    issued =
        swap_->read(from.extent, offset, chunk, n,
                    [this, host, lease, chunk, target = dst + offset, n](absl::Status read) {
                      if (read.ok()) {
                        read = device_.copy_async(target, chunk, n, CopyKind::kHostToDevice, *h2d_);
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
                                                  uint64_t bytes) {
  auto host = std::make_shared<HostCompletion>();
  const auto* src = static_cast<const std::byte*>(from.address);
  absl::Status issued;
  for (uint64_t offset = 0; offset < bytes; offset += staging_->chunk_bytes()) {
    const uint64_t n = std::min(staging_->chunk_bytes(), bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(staging_->acquire(n));
    std::byte* chunk = static_cast<std::byte*>(lease->data());
    issued = device_.copy_async(chunk, src + offset, n, CopyKind::kDeviceToHost, *d2h_);
    if (!issued.ok()) break;
    host->add_part();
    // The callback only hands the write to the I/O worker: the write hashes its units, which
    // must not hold up the copy stream behind it.
    issued = device_.launch_host_callback(
        *d2h_, [this, extent = to.extent, offset, chunk, n, lease, host]() mutable {
          io_->post([swap = swap_, extent, offset, chunk, n, lease = std::move(lease),
                     host = std::move(host)]() mutable {
            auto submitted =
                swap->write(extent, offset, chunk, n,
                            [lease, host](absl::Status written) { host->finish_part(written); });
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
