#include "uring_buffers.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <cerrno>

#include "io_common.h"
#include "strata/base/format_bytes.h"
#include "strata/base/log.h"
#include "strata/base/mutex.h"
#include "strata/testing/fault_injector.h"

namespace strata {
namespace {

constexpr uint64_t kMaxRegisteredBytes = uint64_t{1} << 30;  // the kernel's per-iovec limit

}  // namespace

std::string registration_warning(int err, uint64_t bytes) {
  std::string why;
  if (err == ENOMEM) {
    why =
        "RLIMIT_MEMLOCK is too small to pin them: raise `ulimit -l` (e.g. unlimited) or grant "
        "the process CAP_IPC_LOCK";
  } else if (err == EFAULT || err == EOPNOTSUPP) {
    why =
        "the kernel cannot pin that memory: allocate it as anonymous memory (aligned_alloc or "
        "mmap MAP_ANONYMOUS, writable), not cudaHostAlloc or a file mapping";
  } else if (err == EINVAL) {
    why = "the kernel lacks sparse buffer tables or buffer updates (Linux 5.19+)";
  } else {
    why = "unexpected error";
  }
  return absl::StrFormat(
      "io_uring: %d bytes of fixed buffers not registered (%s): %s; I/O works but costs more CPU",
      bytes, io::errno_text(err), why);
}

UringBuffers::UringBuffers(const std::vector<IoBuffer>& buffers, bool lazy, uint32_t rings,
                           std::shared_ptr<FaultInjector> faults)
    : slots_of_(buffers.size()), lazy_(lazy), faults_(std::move(faults)) {
  struct Cut {
    iovec iov;
    uint32_t buffer;
  };
  std::vector<Cut> cuts;
  for (uint32_t b = 0; b < buffers.size(); ++b) {
    auto* p = static_cast<std::byte*>(buffers[b].data);
    for (uint64_t at = 0; p != nullptr && at < buffers[b].bytes; at += kMaxRegisteredBytes) {
      cuts.push_back({{p + at, std::min(buffers[b].bytes - at, kMaxRegisteredBytes)}, b});
    }
  }
  std::sort(cuts.begin(), cuts.end(),
            [](const Cut& a, const Cut& b) { return a.iov.iov_base < b.iov.iov_base; });
  for (const Cut& cut : cuts) {
    slots_of_[cut.buffer].push_back(static_cast<uint32_t>(iovecs_.size()));
    iovecs_.push_back(cut.iov);
  }
  for (uint32_t r = 0; r < rings; ++r) {
    ready_.push_back(std::make_unique<std::atomic<bool>[]>(iovecs_.size()));
    for (size_t i = 0; i < iovecs_.size(); ++i) ready_.back()[i].store(false);
  }
  MutexLock lock(&mu_);
  rings_.assign(rings, nullptr);
}

void UringBuffers::record(int64_t ns, uint64_t bytes, uint64_t iovecs) {
  registration_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(ns, 0)),
                             std::memory_order_relaxed);
  registered_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  registrations_.fetch_add(iovecs, std::memory_order_relaxed);
}

std::string UringBuffers::attach(uint32_t ring_index, io_uring* ring) {
  MutexLock lock(&mu_);
  rings_[ring_index] = ring;
  if (iovecs_.empty()) return "";
  const auto count = static_cast<unsigned>(iovecs_.size());
  const int64_t start = io::now_ns();
  if (lazy_) {
    // A failed sparse table means no lazy registration on any ring: stop for the engine.
    int ret = faults_ != nullptr ? faults_->apply_registration() : 0;
    if (ret == 0) ret = io_uring_register_buffers_sparse(ring, count);
    record(io::now_ns() - start, 0, 0);
    if (ret < 0 && !stopped_) {
      stopped_ = true;
      failures_.fetch_add(1, std::memory_order_relaxed);
      uint64_t bytes = 0;
      for (const iovec& v : iovecs_) bytes += v.iov_len;
      warning_ = registration_warning(-ret, bytes);
      return warning_;
    }
    return "";
  }
  int ret = faults_ != nullptr ? faults_->apply_registration() : 0;
  if (ret == 0) ret = io_uring_register_buffers(ring, iovecs_.data(), count);
  uint64_t bytes = 0;
  for (const iovec& v : iovecs_) bytes += v.iov_len;
  if (ret < 0) {
    record(io::now_ns() - start, 0, 0);
    failures_.fetch_add(1, std::memory_order_relaxed);
    return registration_warning(-ret, bytes);
  }
  record(io::now_ns() - start, bytes, iovecs_.size());
  for (size_t i = 0; i < iovecs_.size(); ++i) {
    ready_[ring_index][i].store(true, std::memory_order_release);
  }
  return "";
}

absl::Status UringBuffers::register_buffer(uint32_t index) {
  MutexLock lock(&mu_);
  if (index >= slots_of_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "io_uring: no fixed buffer %d to register (the engine has %d)", index, slots_of_.size()));
  }
  if (!lazy_ || stopped_) return absl::OkStatus();
  for (const uint32_t slot : slots_of_[index]) {
    for (uint32_t r = 0; r < rings_.size(); ++r) {
      if (rings_[r] == nullptr || ready_[r][slot].load(std::memory_order_relaxed)) continue;
      const int64_t start = io::now_ns();
      int ret = faults_ != nullptr ? faults_->apply_registration() : 0;
      if (ret == 0) {
        ret = io_uring_register_buffers_update_tag(rings_[r], slot, &iovecs_[slot], nullptr, 1);
        if (ret == 0) ret = -EINVAL;  // updated nothing: not expected
      }
      if (ret < 0) {
        record(io::now_ns() - start, 0, 0);
        stopped_ = true;
        failures_.fetch_add(1, std::memory_order_relaxed);
        warning_ = absl::StrFormat(
            "%s (buffer registration stopped with %s registered; the rest is used unregistered)",
            registration_warning(-ret, iovecs_[slot].iov_len),
            format_bytes(registered_bytes_.load(std::memory_order_relaxed)));
        log::warn_once(warning_);
        return absl::Status(absl::ErrnoToStatusCode(-ret), warning_);
      }
      record(io::now_ns() - start, iovecs_[slot].iov_len, 1);
      ready_[r][slot].store(true, std::memory_order_release);
    }
  }
  return absl::OkStatus();
}

void UringBuffers::detach_all() {
  MutexLock lock(&mu_);
  std::fill(rings_.begin(), rings_.end(), nullptr);
  stopped_ = true;
}

int UringBuffers::fixed_index(uint32_t ring_index, const void* p, uint64_t n) const {
  const auto* b = static_cast<const std::byte*>(p);
  auto it =
      std::upper_bound(iovecs_.begin(), iovecs_.end(), b, [](const std::byte* x, const iovec& v) {
        return x < static_cast<const std::byte*>(v.iov_base);
      });
  if (it == iovecs_.begin()) return -1;
  --it;
  const auto* base = static_cast<const std::byte*>(it->iov_base);
  if (static_cast<uint64_t>(b - base) + n > it->iov_len) return -1;
  const auto slot = static_cast<int>(it - iovecs_.begin());
  return ready_[ring_index][slot].load(std::memory_order_acquire) ? slot : -1;
}

std::string UringBuffers::warning() const {
  MutexLock lock(&mu_);
  return warning_;
}

void UringBuffers::add_stats(IoStats& stats) const {
  stats.registered_bytes = registered_bytes_.load(std::memory_order_relaxed);
  stats.registrations = registrations_.load(std::memory_order_relaxed);
  stats.registration_ns = registration_ns_.load(std::memory_order_relaxed);
  stats.registration_failures = failures_.load(std::memory_order_relaxed);
}

}  // namespace strata
