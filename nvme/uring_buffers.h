// UringBuffers: the memory an io_uring engine may read into and write from with READ_FIXED /
// WRITE_FIXED, and which of it each ring has registered. Private to nvme/uring_engine.cc.
//
// IoEngineOptions::fixed_buffers are cut into iovecs of at most 1 GiB (the kernel's limit per
// buffer) and sorted by address; iovec i is slot i of every ring's buffer table.
//   - Eager (the default): each ring registers every slot when it starts.
//   - Lazy (IoEngineOptions::lazy_buffers): each ring starts with a sparse table of as many
//     slots (Linux 5.19+; nothing pinned, nothing charged to RLIMIT_MEMLOCK), and
//     register_buffer(b) fills buffer b's slots on every ring (IORING_REGISTER_BUFFERS_UPDATE),
//     from whichever thread calls it, while the rings run.
// A request uses a slot only once its own ring has registered it; any other buffer goes through
// plain READ/WRITE. So registration changes what a request costs, never what it does. The first
// failure stops lazy registration for the engine, with one warning; what is registered stays.
#pragma once

#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>
#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/nvme/io_engine.h"

namespace strata {

class FaultInjector;

class UringBuffers {
 public:
  // `rings`: how many rings will attach (one per worker), known before the first starts.
  UringBuffers(const std::vector<IoBuffer>& buffers, bool lazy, uint32_t rings,
               std::shared_ptr<FaultInjector> faults);
  UringBuffers(const UringBuffers&) = delete;
  UringBuffers& operator=(const UringBuffers&) = delete;

  // A new ring, before its worker thread starts: registers every slot (eager) or an empty table
  // (lazy). Returns a warning when that failed (the ring works without fixed buffers), else "".
  std::string attach(uint32_t ring_index, io_uring* ring);
  // Lazy only (else a no-op): registers buffer `index` on every attached ring. See io_engine.h.
  absl::Status register_buffer(uint32_t index);
  // The engine is stopping: waits for a registration in progress; later ones do nothing.
  void detach_all();

  // The slot holding [p, p + n) entirely if ring `ring_index` has registered it, else -1.
  // Called by that ring's worker for every request; lock-free.
  int fixed_index(uint32_t ring_index, const void* p, uint64_t n) const;

  // The registration failure that stopped lazy registration, or "".
  std::string warning() const;
  // Adds the registration counters to an engine's statistics.
  void add_stats(IoStats& stats) const;

 private:
  void record(int64_t ns, uint64_t bytes, uint64_t iovecs);

  std::vector<iovec> iovecs_;                    // sorted by address; immutable
  std::vector<std::vector<uint32_t>> slots_of_;  // per buffer of the options: its iovecs
  const bool lazy_;
  const std::shared_ptr<FaultInjector> faults_;
  // Per ring, per slot: registered on that ring. Set after the kernel accepted it (release);
  // read by that ring's worker (acquire).
  std::vector<std::unique_ptr<std::atomic<bool>[]>> ready_;

  mutable absl::Mutex mu_;  // one registration at a time
  std::vector<io_uring*> rings_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string warning_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> registered_bytes_{0}, registrations_{0}, registration_ns_{0}, failures_{0};
};

// "io_uring: 1073741824 bytes of fixed buffers not registered (...): RLIMIT_MEMLOCK is too small
// ...; I/O works but costs more CPU".
std::string registration_warning(int err, uint64_t bytes);

}  // namespace strata
