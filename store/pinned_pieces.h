// PinnedPieces: the pinned CPU tier's slab, pinned in pieces as the tier fills.
//
// The slab is reserved whole at start (aligned_alloc: address space; the kernel backs a page when
// it is first touched). Pinning it whole at start — cudaHostRegister on CUDA, then
// io_uring_register_buffers for NVMe I/O — faulted in and pinned every page before the first
// tensor: 17.8 s for 31 GiB on an H200 machine, about 3 s per GiB on the test VM. Instead the
// slab is cut into fixed pieces (64 MiB by default), and a piece is pinned the first time the
// tier hands out bytes in it:
//   - with the device (register_host), on the thread that allocates, before the block is
//     returned, so device copies never see tier memory that is half pinned (and CudaDevice
//     copies a range spanning several pieces one piece at a time);
//   - with the listener (the NVMe engine, which registers it with io_uring), on a background
//     thread, since I/O into a piece not yet registered works unregistered meanwhile.
// Pieces stay pinned until the tier is destroyed: what is pinned is the tier's high-water mark,
// rounded up to pieces. Piece 0 is pinned at creation, so a device that refuses to pin at all
// fails there, as before; a later failure leaves that piece (and later ones) unpinned, with one
// warning, and copies through it stay correct (pageable). Private to store/.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "strata/device/device.h"
#include "strata/store/tier.h"

namespace strata {

class PinnedPieces {
 public:
  // Called on the background thread with a piece's index, once per piece, in the order pieces
  // were first used.
  using Listener = absl::AnyInvocable<void(uint32_t piece)>;

  // `piece_bytes` 0: the default (kDefaultPieceBytes, larger for tiers over 1 TiB so that no
  // more than kMaxPieces pieces exist: io_uring's table holds at most 16384 buffers).
  static absl::StatusOr<std::unique_ptr<PinnedPieces>> create(Device& device, uint64_t bytes,
                                                              uint64_t piece_bytes,
                                                              std::string_view what);
  static constexpr uint64_t kDefaultPieceBytes = uint64_t{64} << 20;
  static constexpr uint64_t kMaxPieces = 16384;
  static uint64_t choose_piece_bytes(uint64_t bytes, uint64_t asked);

  ~PinnedPieces();
  PinnedPieces(const PinnedPieces&) = delete;
  PinnedPieces& operator=(const PinnedPieces&) = delete;

  std::byte* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t piece_bytes() const { return piece_bytes_; }
  uint32_t count() const { return count_; }

  // Pins (with the device, on this thread) every piece that [offset, offset + bytes) touches and
  // that was never pinned, and queues it for the listener. Thread-safe; cheap when nothing is new.
  void ensure(uint64_t offset, uint64_t bytes);

  // Sets the listener and queues every piece in use so far for it; null detaches, after the
  // call in progress (if any) has returned, dropping pieces not yet handed over. Starts or stops
  // the background thread. Not to be called concurrently with itself.
  void set_listener(Listener listener);
  // Blocks until the listener has returned for every piece queued so far (benchmarks wait for
  // it before timing, through Runtime::wait_for_registration(); the runtime itself never does).
  void wait_listener_idle() const;

  PinningStats stats() const;
  // The pinning failure since start, or "".
  std::string warning() const;

  // Use create().
  PinnedPieces(Device& device, std::byte* base, uint64_t bytes, uint64_t piece_bytes,
               std::string what);

 private:
  enum State : uint8_t { kNew = 0, kPinned = 1, kUnpinned = 2 };  // kUnpinned: pinning failed
  // The device's error when pinning failed (recorded in warning_ and stats_ either way).
  absl::Status pin_locked(uint32_t piece) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pin_mu_);
  void run_listener();

  Device& device_;
  std::byte* const base_;  // aligned_alloc'd; freed last
  const uint64_t bytes_;
  const uint64_t piece_bytes_;
  const uint32_t count_;
  const std::string what_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // per piece; set under pin_mu_

  mutable absl::Mutex pin_mu_;  // pins one piece at a time (ordered after MemoryTier's mutex)
  std::vector<std::unique_ptr<HostRegistration>> registrations_ ABSL_GUARDED_BY(pin_mu_);
  bool stopped_ ABSL_GUARDED_BY(pin_mu_) = false;  // a pin failed: no more attempts
  std::string warning_ ABSL_GUARDED_BY(pin_mu_);
  std::vector<uint32_t> used_ ABSL_GUARDED_BY(pin_mu_);  // pieces in first-use order
  PinningStats stats_ ABSL_GUARDED_BY(pin_mu_);

  mutable absl::Mutex listen_mu_;  // ordered after pin_mu_
  mutable absl::CondVar listen_cv_;
  Listener listener_;                                   // replaced only while the thread is stopped
  bool listening_ ABSL_GUARDED_BY(listen_mu_) = false;  // the thread runs: queue new pieces
  std::deque<uint32_t> queue_ ABSL_GUARDED_BY(listen_mu_);
  bool calling_ ABSL_GUARDED_BY(listen_mu_) = false;  // the thread is inside the listener
  bool stop_ ABSL_GUARDED_BY(listen_mu_) = false;
  uint64_t handed_ ABSL_GUARDED_BY(listen_mu_) = 0;
  uint64_t listener_ns_ ABSL_GUARDED_BY(listen_mu_) = 0;
  std::thread thread_;  // started and joined by set_listener (and the destructor)
};

}  // namespace strata
