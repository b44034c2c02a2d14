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
  MutexLock lock(&mu_);
  // A private copy: absl::Status shares its message through uninstrumented refcounts.
  if (!status.ok() && status_.ok()) status_ = absl::Status(status.code(), status.message());
  if (--parts_ == 0) done_cv_.SignalAll();
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
  if (host != nullptr) {
    if (!host->done()) return false;
    if (auto status = host->wait(); !status.ok()) return status;
  }
  if (event != nullptr) return device.query(*event);
  return true;
}

absl::Status MoveTicket::wait(Device& device) const {
  absl::Status status;
  if (host != nullptr) status = host->wait();
  if (event != nullptr) {
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
    // The host waits: the destination is host memory, read by io_uring, not by a stream.
    if (auto status = sync_on(after); !status.ok()) return status;
    if (auto status = swap_->read_sync(from.extent, to.address, bytes); !status.ok()) {
      return status;
    }
    return MoveTicket{};
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

absl::StatusOr<MoveTicket> TierMover::nvme_to_gpu(const Place& from, const Place& to,
                                                  uint64_t bytes) {
  // First error among the reads' callbacks (they run on I/O threads).
  auto errors = std::make_shared<HostCompletion>();
  IoWaiter waiter;
  auto* dst = static_cast<std::byte*>(to.address);
  for (uint64_t offset = 0; offset < bytes; offset += staging_->chunk_bytes()) {
    const uint64_t n = std::min(staging_->chunk_bytes(), bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(staging_->acquire());
    IoCallback done = waiter.track();
    std::byte* chunk = static_cast<std::byte*>(lease->data());
    auto status =
        swap_->read(from.extent, offset, chunk, n,
                    [this, errors, lease, chunk, target = dst + offset, n,
                     done = std::move(done)](absl::Status read) mutable {
                      if (read.ok())
                        read = device_.copy_async(target, chunk, n, CopyKind::kHostToDevice, *h2d_);
                      // The chunk goes back to the pool once its H2D copy has run.
                      if (read.ok()) read = device_.launch_host_callback(*h2d_, [lease] {});
                      if (!read.ok()) {
                        errors->add_part();
                        errors->finish_part(read);
                      }
                      std::move(done)(read);
                    });
    if (!status.ok()) {
      errors->add_part();
      errors->finish_part(status);
      break;
    }
  }
  (void)waiter.wait();
  errors->finish_part(absl::OkStatus());
  if (auto status = errors->wait(); !status.ok()) return status;
  auto event = events_.record(*h2d_);
  if (!event.ok()) return event.status();
  return MoveTicket{*std::move(event), h2d_.get(), nullptr};
}

absl::StatusOr<MoveTicket> TierMover::gpu_to_nvme(const Place& from, const Place& to,
                                                  uint64_t bytes) {
  auto host = std::make_shared<HostCompletion>();
  const auto* src = static_cast<const std::byte*>(from.address);
  absl::Status issued;
  for (uint64_t offset = 0; offset < bytes; offset += staging_->chunk_bytes()) {
    const uint64_t n = std::min(staging_->chunk_bytes(), bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(staging_->acquire());
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
