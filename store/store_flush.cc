// flush(): every copy newer than its home copy written back home, several at once, and waited
// for (the one call that promises the host the home copies are complete when it returns).
#include <atomic>
#include <thread>

#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

namespace {

// Write-backs flush() runs at once.
constexpr size_t kFlushParallelism = 8;

}  // namespace

absl::Status TensorStore::flush() {
  Impl& s = *impl_;
  std::vector<TensorHandle> dirty;
  {
    MutexLock lock(&s.mu);
    // Write-backs already in flight (evictions') end first. One that failed leaves its copy the
    // only newest, and the scan below writes it back again.
    const std::vector<std::shared_ptr<Impl::InFlight>> pending(s.in_flight.begin(),
                                                               s.in_flight.end());
    for (const auto& m : pending) (void)s.wait_for(*m);
    for (const auto& owned : s.tensors) {
      const Impl::Tensor& t = *owned;
      const Impl::Copy& home = t.copies[tier_index(t.home)];
      if (t.live && !home.valid() && s.newest_copy(t, t.home).has_value()) {
        dirty.push_back(TensorHandle{t.index, t.generation});
      }
    }
  }
  // Several write-backs at once: each moves one tensor, and one at a time leaves the drives
  // idle between small tensors. Write-backs of different tensors are independent.
  absl::Mutex error_mu;
  absl::Status first;
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < dirty.size(); i = next++) {
      absl::Status status;
      {
        MutexLock lock(&s.mu);
        auto found = s.live(dirty[i]);
        if (!found.ok()) continue;  // destroyed meanwhile: nothing to keep
        Impl::Tensor& t = **found;
        OperationGuard guard(s, t);
        const Impl::Copy& home = t.copies[tier_index(t.home)];
        const std::optional<TierKind> source = s.newest_copy(t, t.home);
        // Still being written by the trainer: its bytes are not final; the next flush takes them.
        if (home.valid() || home.arriving() || !source.has_value() ||
            t.copies[tier_index(*source)].writers() > 0) {
          continue;
        }
        auto write = s.write_back(t, *source);
        if (!write.ok()) {
          status = write.status();
        } else if (*write != nullptr) {
          status = s.wait_for(**write);
        }
      }
      if (!status.ok()) {
        MutexLock lock(&error_mu);
        // A private copy: absl::Status shares its message through uninstrumented refcounts.
        if (first.ok()) first = absl::Status(status.code(), status.message());
      }
    }
  };
  const size_t helpers =
      std::min<size_t>(dirty.size(), kFlushParallelism) - (dirty.empty() ? 0 : 1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < helpers; ++i) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  MutexLock lock(&error_mu);
  return absl::Status(first.code(), first.message());
}

}  // namespace strata
