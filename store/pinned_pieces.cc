#include "pinned_pieces.h"

#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cstdlib>

#include "strata/base/format_bytes.h"
#include "strata/base/log.h"
#include "strata/base/mutex.h"

namespace strata {
namespace {

constexpr uint64_t kPage = PinnedHostMemory::kAlignment;
constexpr uint64_t kMaxPieceBytes = uint64_t{1} << 30;  // io_uring's limit per buffer

int64_t now_ns() { return absl::ToUnixNanos(absl::Now()); }

}  // namespace

uint64_t PinnedPieces::choose_piece_bytes(uint64_t bytes, uint64_t asked) {
  uint64_t piece = asked != 0 ? asked : kDefaultPieceBytes;
  if (asked == 0) piece = std::max(piece, (bytes + kMaxPieces - 1) / kMaxPieces);
  piece = std::clamp<uint64_t>((piece + kPage - 1) / kPage * kPage, kPage, kMaxPieceBytes);
  return piece;
}

absl::StatusOr<std::unique_ptr<PinnedPieces>> PinnedPieces::create(Device& device, uint64_t bytes,
                                                                   uint64_t piece_bytes,
                                                                   std::string_view what) {
  if (bytes == 0 || bytes % kPage != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes is not a positive multiple of 4096", what, bytes));
  }
  // Address space only: pages are backed when first touched (pinning touches them).
  auto* base = static_cast<std::byte*>(std::aligned_alloc(kPage, bytes));
  if (base == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: cannot reserve %s of host memory; lower STRATA_CPU_BYTES or free memory on this "
        "machine",
        what, format_bytes(bytes)));
  }
  auto pieces = std::make_unique<PinnedPieces>(
      device, base, bytes, choose_piece_bytes(bytes, piece_bytes), std::string(what));
  // Piece 0 now: a device that cannot pin at all fails here, at start, with its reason.
  {
    MutexLock lock(&pieces->pin_mu_);
    if (absl::Status status = pieces->pin_locked(0); !status.ok()) {
      return absl::Status(status.code(), absl::StrFormat("%s: %s", what, status.message()));
    }
  }
  return pieces;
}

PinnedPieces::PinnedPieces(Device& device, std::byte* base, uint64_t bytes, uint64_t piece_bytes,
                           std::string what)
    : device_(device),
      base_(base),
      bytes_(bytes),
      piece_bytes_(piece_bytes),
      count_(static_cast<uint32_t>((bytes + piece_bytes - 1) / piece_bytes)),
      what_(std::move(what)),
      state_(std::make_unique<std::atomic<uint8_t>[]>(count_)) {
  for (uint32_t i = 0; i < count_; ++i) state_[i].store(kNew);
  MutexLock lock(&pin_mu_);
  registrations_.resize(count_);
  stats_.piece_bytes = piece_bytes_;
  stats_.pieces = count_;
}

PinnedPieces::~PinnedPieces() {
  set_listener(nullptr);
  {
    MutexLock lock(&pin_mu_);
    registrations_.clear();  // unregistered before the memory goes
  }
  std::free(base_);
}

void PinnedPieces::ensure(uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || offset >= bytes_) return;
  const auto first = static_cast<uint32_t>(offset / piece_bytes_);
  const auto last = static_cast<uint32_t>((std::min(offset + bytes, bytes_) - 1) / piece_bytes_);
  bool all_done = true;
  for (uint32_t i = first; i <= last && all_done; ++i) {
    all_done = state_[i].load(std::memory_order_acquire) != kNew;
  }
  if (all_done) return;
  MutexLock lock(&pin_mu_);
  for (uint32_t i = first; i <= last; ++i) {
    if (state_[i].load(std::memory_order_relaxed) == kNew) (void)pin_locked(i);  // see warning_
  }
}

absl::Status PinnedPieces::pin_locked(uint32_t piece) {
  const uint64_t at = uint64_t{piece} * piece_bytes_;
  const uint64_t n = std::min(piece_bytes_, bytes_ - at);
  State state = kUnpinned;
  absl::Status result;
  if (!stopped_) {
    const int64_t start = now_ns();
    auto registration = device_.register_host(base_ + at, n);
    stats_.pin_ns += static_cast<uint64_t>(std::max<int64_t>(0, now_ns() - start));
    if (registration.ok()) {
      registrations_[piece] = *std::move(registration);
      ++stats_.pinned_pieces;
      stats_.pinned_bytes += n;
      state = kPinned;
    } else {
      // Later pieces would most likely fail the same way, each after a slow attempt.
      result = registration.status();
      stopped_ = true;
      warning_ = absl::StrFormat(
          "%s: pinning piece %d (%s at offset %s) failed: %s; it and the pieces used after it "
          "stay unpinned (copies through them are slower but correct); %s of %s pinned",
          what_, piece, format_bytes(n), format_bytes(at), registration.status().message(),
          format_bytes(stats_.pinned_bytes), format_bytes(bytes_));
      if (piece != 0) log::warn_once(warning_);  // piece 0 fails create() instead
    }
  }
  if (state == kUnpinned) ++stats_.unpinned_pieces;
  state_[piece].store(state, std::memory_order_release);
  used_.push_back(piece);
  MutexLock lock(&listen_mu_);
  if (listening_) {
    queue_.push_back(piece);
    listen_cv_.SignalAll();
  }
  return result;
}

void PinnedPieces::set_listener(Listener listener) {
  {
    MutexLock lock(&listen_mu_);
    stop_ = true;
    listening_ = false;
    queue_.clear();
    listen_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  listener_ = std::move(listener);
  if (!listener_) return;
  MutexLock pin_lock(&pin_mu_);
  MutexLock lock(&listen_mu_);
  stop_ = false;
  listening_ = true;
  queue_.assign(used_.begin(), used_.end());
  thread_ = std::thread([this] { run_listener(); });
}

void PinnedPieces::run_listener() {
  for (;;) {
    uint32_t piece;
    {
      MutexLock lock(&listen_mu_);
      while (!stop_ && queue_.empty()) wait(&listen_cv_, &listen_mu_);
      if (stop_) return;
      piece = queue_.front();
      queue_.pop_front();
      calling_ = true;
    }
    const int64_t start = now_ns();
    listener_(piece);
    const auto spent = static_cast<uint64_t>(std::max<int64_t>(0, now_ns() - start));
    MutexLock lock(&listen_mu_);
    calling_ = false;
    ++handed_;
    listener_ns_ += spent;
    listen_cv_.SignalAll();
  }
}

void PinnedPieces::wait_listener_idle() const {
  MutexLock lock(&listen_mu_);
  while (!queue_.empty() || calling_) wait(&listen_cv_, &listen_mu_);
}

PinningStats PinnedPieces::stats() const {
  PinningStats stats;
  {
    MutexLock lock(&pin_mu_);
    stats = stats_;
  }
  MutexLock lock(&listen_mu_);
  stats.listener_pieces = handed_;
  stats.listener_ns = listener_ns_;
  return stats;
}

std::string PinnedPieces::warning() const {
  MutexLock lock(&pin_mu_);
  return warning_;
}

}  // namespace strata
