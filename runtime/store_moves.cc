// Bytes between tiers, for TensorStore. Called with the store's lock held; it is released for
// the copies and I/O themselves. The caller has pinned the source copy and marked the
// destination moving, so neither changes underneath.
//
//   cpu -> gpu   H2D on the h2d stream after the copies' pending work; the host does not wait.
//   gpu -> cpu   D2H on the d2h stream; the host waits (the CPU copy is host memory).
//   nvme -> cpu  swap read straight into the pinned CPU-tier block (registered with io_uring).
//   cpu -> nvme  swap write straight from it.
//   nvme -> gpu  through staging chunks, pipelined: the read of chunk k+1 overlaps the H2D of k;
//                the host waits for the reads only.
//   gpu -> nvme  through staging chunks: D2H of chunk k, then its swap write from a stream
//                callback, overlapping the D2H of k+1; the host waits for the writes.
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

namespace {

// First error among asynchronous parts (callbacks run on I/O and stream threads).
class FirstError {
 public:
  void add(const absl::Status& status) {
    if (status.ok()) return;
    MutexLock lock(&mu_);
    if (status_.ok()) status_ = absl::Status(status.code(), status.message());
  }
  absl::Status get() {
    MutexLock lock(&mu_);
    return absl::Status(status_.code(), status_.message());
  }

 private:
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

absl::Status wait_all(Device& device, Stream& stream,
                      const std::vector<std::shared_ptr<Event>>& events) {
  for (const auto& e : events) {
    if (auto status = device.wait(stream, *e); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status sync_all(Device& device, const std::vector<std::shared_ptr<Event>>& events) {
  for (const auto& e : events) {
    if (auto status = device.synchronize(*e); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Event>> record(Device& device, Stream& stream) {
  auto event = device.create_event();
  if (!event.ok()) return event.status();
  if (auto status = device.record(**event, stream); !status.ok()) return status;
  return std::shared_ptr<Event>(*std::move(event));
}

struct Endpoints {
  void* src = nullptr;
  void* dst = nullptr;
  ExtentHandle extent;  // the NVMe side, if any
  uint64_t bytes = 0;
  std::vector<std::shared_ptr<Event>> pending;  // work on either copy that must come first
};

absl::StatusOr<std::shared_ptr<Event>> nvme_to_gpu(Device& device, Stream& h2d, SwapSpace& swap,
                                                   StagingPool& staging, const Endpoints& e) {
  if (auto status = wait_all(device, h2d, e.pending); !status.ok()) return status;
  auto errors = std::make_shared<FirstError>();
  IoWaiter waiter;
  auto* dst = static_cast<std::byte*>(e.dst);
  for (uint64_t offset = 0; offset < e.bytes; offset += staging.chunk_bytes()) {
    const uint64_t n = std::min(staging.chunk_bytes(), e.bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(staging.acquire());
    IoCallback done = waiter.track();
    std::byte* chunk = static_cast<std::byte*>(lease->data());
    auto status =
        swap.read(e.extent, offset, chunk, n,
                  [&device, &h2d, errors, lease, chunk, target = dst + offset, n,
                   done = std::move(done)](absl::Status read) mutable {
                    if (read.ok())
                      read = device.copy_async(target, chunk, n, CopyKind::kHostToDevice, h2d);
                    // The chunk goes back to the pool once its H2D copy has run.
                    if (read.ok()) read = device.launch_host_callback(h2d, [lease] {});
                    errors->add(read);
                    std::move(done)(read);
                  });
    if (!status.ok()) {
      errors->add(status);
      break;
    }
  }
  (void)waiter.wait();
  if (auto status = errors->get(); !status.ok()) return status;
  return record(device, h2d);
}

absl::Status gpu_to_nvme(Device& device, Stream& d2h, SwapSpace& swap, StagingPool& staging,
                         const Endpoints& e) {
  if (auto status = wait_all(device, d2h, e.pending); !status.ok()) return status;
  auto errors = std::make_shared<FirstError>();
  IoWaiter waiter;
  const auto* src = static_cast<const std::byte*>(e.src);
  for (uint64_t offset = 0; offset < e.bytes; offset += staging.chunk_bytes()) {
    const uint64_t n = std::min(staging.chunk_bytes(), e.bytes - offset);
    auto lease = std::make_shared<StagingPool::Lease>(staging.acquire());
    std::byte* chunk = static_cast<std::byte*>(lease->data());
    if (auto status = device.copy_async(chunk, src + offset, n, CopyKind::kDeviceToHost, d2h);
        !status.ok()) {
      errors->add(status);
      break;
    }
    IoCallback done = waiter.track();
    auto status =
        device.launch_host_callback(d2h, [&swap, extent = e.extent, offset, chunk, n, lease, errors,
                                          done = std::move(done)]() mutable {
          auto shared_done = std::make_shared<IoCallback>(std::move(done));
          auto submitted = swap.write(extent, offset, chunk, n,
                                      [lease, errors, shared_done](absl::Status written) {
                                        errors->add(written);
                                        std::move (*shared_done)(written);
                                      });
          if (!submitted.ok()) {
            errors->add(submitted);
            std::move (*shared_done)(submitted);
          }
        });
    if (!status.ok()) {
      errors->add(status);
      break;
    }
  }
  (void)waiter.wait();
  return errors->get();
}

}  // namespace

absl::Status Impl::transfer(Tensor& t, TierKind from, TierKind to) {
  Copy& src = t.copies[tier_index(from)];
  Copy& dst = t.copies[tier_index(to)];
  Endpoints e;
  e.bytes = t.bytes;
  if (from != TierKind::kNvme) e.src = address(t, from);
  if (to != TierKind::kNvme) e.dst = address(t, to);
  e.extent = from == TierKind::kNvme ? src.extent : dst.extent;
  e.pending = src.busy;
  e.pending.insert(e.pending.end(), dst.busy.begin(), dst.busy.end());

  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Event>> arrival = std::shared_ptr<Event>();
  absl::Status status;
  {
    MutexUnlock unlock(&mu);
    if (from == TierKind::kCpu && to == TierKind::kGpu) {
      status = wait_all(device, *h2d, e.pending);
      if (status.ok())
        status = device.copy_async(e.dst, e.src, e.bytes, CopyKind::kHostToDevice, *h2d);
      if (status.ok()) arrival = record(device, *h2d);
    } else if (from == TierKind::kGpu && to == TierKind::kCpu) {
      status = wait_all(device, *d2h, e.pending);
      if (status.ok())
        status = device.copy_async(e.dst, e.src, e.bytes, CopyKind::kDeviceToHost, *d2h);
      if (status.ok()) status = device.synchronize(*d2h);
    } else if (from == TierKind::kNvme && to == TierKind::kCpu) {
      status = sync_all(device, e.pending);
      if (status.ok()) status = nvme->read_sync(e.extent, e.dst, e.bytes);
    } else if (from == TierKind::kCpu && to == TierKind::kNvme) {
      status = sync_all(device, e.pending);
      if (status.ok()) status = nvme->write_sync(e.extent, e.src, e.bytes);
    } else if (from == TierKind::kNvme && to == TierKind::kGpu) {
      arrival = nvme_to_gpu(device, *h2d, *nvme, *staging, e);
    } else if (from == TierKind::kGpu && to == TierKind::kNvme) {
      status = gpu_to_nvme(device, *d2h, *nvme, *staging, e);
    } else {
      status = absl::InternalError(
          absl::StrFormat("no move from %s to %s", to_string(from), to_string(to)));
    }
  }
  if (status.ok() && !arrival.ok()) status = arrival.status();
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrFormat("moving tensor '%s' (%d bytes) from %s to %s: %s", t.name,
                                        t.bytes, to_string(from), to_string(to), status.message()));
  }
  // The arrival (H2D) must finish before either copy's memory is reused or the GPU copy read.
  if (*arrival != nullptr) {
    for (TierKind k : {from, to}) {
      Copy& c = t.copies[tier_index(k)];
      if (k == TierKind::kNvme || !c.present) continue;
      c.busy.push_back(*arrival);
      watched.insert(key(t.index, k));
    }
  }
  MoveStats& m = counters.moves[tier_index(from)][tier_index(to)];
  m.bytes += t.bytes;
  ++m.moves;
  m.ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace strata
