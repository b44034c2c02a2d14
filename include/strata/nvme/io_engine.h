// IoEngine: asynchronous reads and writes of (file, offset, buffer, length) with per-request
// completion, batched submission and a bounded number of requests in flight.
//
// Files and fixed buffers are given when the engine is created (SwapSpace knows both at start).
// io_uring registers the files at once and the buffers at once or, with lazy_buffers, each when
// register_buffer() says it comes into use. Every request completes exactly once, through its
// callback, on an engine thread, after the engine's retry policy:
//   - short transfers are resubmitted for the remainder (a read that returns 0 bytes before the
//     end is an error: the file is shorter than the request);
//   - -EAGAIN and -EINTR are retried (bounded: kMaxRetries per request);
//   - every other error (EIO, ENOSPC, EBADF, ...) completes the request with a Status naming the
//     operation, the file, the offset, the length and the errno text. It is not retried: the
//     caller still holds the source bytes and decides.
// Callbacks must be quick and must not block on other requests of the same engine.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/nvme/io_engine_kind.h"

namespace strata {

// How errors and hints name the settings a user can change. The nvme/ floor speaks in its own
// words by default ("the I/O depth"); a caller that knows what the user set passes its own
// names, so that a user reads the knob to turn.
struct IoSettingNames {
  std::string engine = "the I/O engine setting";
  std::string depth = "the I/O depth";
  std::string stripe = "the stripe unit";
  std::string bytes_per_path = "the swap size per path";
  std::string paths = "the swap path list";
};

// Requests in flight per io_uring worker, or psync threads (capped at 64), 1..kMaxIoDepth.
inline constexpr uint32_t kMaxIoDepth = 4096;
// The one check of a depth: "0 is out of range: use an integer from 1 to 4096". The message
// starts with the value; callers put the setting's name in front.
absl::Status check_io_depth(int64_t depth);

enum class IoOp { kRead, kWrite };

std::string_view to_string(IoOp op);

using IoCallback = absl::AnyInvocable<void(absl::Status) &&>;

struct IoRequest {
  IoOp op = IoOp::kRead;
  uint32_t file = 0;  // index into IoEngineOptions::files
  uint64_t offset = 0;
  void* buffer = nullptr;
  uint64_t length = 0;
  IoCallback done;  // called exactly once
};

struct IoFile {
  int fd = -1;  // opened by the caller (O_DIRECT where supported); the engine does not close it
  std::string name;  // for error messages: the path or "swap file in /mnt/nvme0"
};

struct IoBuffer {
  void* data = nullptr;
  uint64_t bytes = 0;
};

struct IoEngineOptions {
  std::vector<IoFile> files;
  // Memory that most requests use (the pinned CPU tier, which holds the staging buffers).
  // io_uring registers it for READ_FIXED/WRITE_FIXED; requests outside it still work.
  std::vector<IoBuffer> fixed_buffers;
  // false: every ring registers all of fixed_buffers when it starts, which pins (faults in)
  // all of that memory then: about 3 s per GiB on a VM, 17.8 s for 31 GiB on an H200 machine.
  // true: rings start with an empty table of as many slots (nothing pinned or charged to
  // RLIMIT_MEMLOCK), and register_buffer(i) registers fixed_buffers[i], as its memory comes into
  // use; requests into a buffer not yet registered use plain READ/WRITE meanwhile.
  bool lazy_buffers = false;
  uint32_t depth = 32;   // requests in flight per worker (io_uring) or threads (psync)
  uint32_t workers = 0;  // io_uring rings, each on its own thread; 0: one per file
  IoSettingNames names;  // for errors and hints
  // Tests only: faults applied to raw results before the retry logic.
  std::shared_ptr<class FaultInjector> faults;
};

struct IoStats {
  uint64_t reads = 0;  // completed requests
  uint64_t writes = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t errors = 0;           // requests completed with an error
  uint64_t retries = 0;          // EAGAIN/EINTR resubmissions
  uint64_t short_transfers = 0;  // remainders resubmitted
  uint64_t fixed_requests = 0;   // requests that used a registered buffer
  uint64_t busy_ns = 0;          // summed submit-to-completion time of all requests
  uint64_t max_in_flight = 0;
  // Buffer registration (io_uring). Each ring registers for itself, so a buffer registered on
  // two rings counts twice: registered_bytes is what the rings pin, and without CAP_IPC_LOCK
  // what they charge to RLIMIT_MEMLOCK.
  uint64_t registered_bytes = 0;
  uint64_t registrations = 0;          // (buffer, ring) pairs registered (per <= 1 GiB piece)
  uint64_t registration_ns = 0;        // time spent in io_uring_register for buffers
  uint64_t registration_failures = 0;  // registration stops at the first (see warning())
};

class IoEngine {
 public:
  static constexpr int kMaxRetries = 64;

  virtual ~IoEngine() = default;

  // "io_uring" or "psync" (or a wrapper's name).
  virtual std::string_view name() const = 0;
  // Set when the engine runs degraded, e.g. "buffers not registered: RLIMIT_MEMLOCK is 8 MiB".
  virtual std::string warning() const { return {}; }

  // Queues the requests (one batch: io_uring submits them with one system call where depth
  // allows). Returns an error without calling any callback only for malformed requests (bad file
  // index, null buffer, zero length) or a stopped engine; otherwise every callback will run.
  virtual absl::Status submit(std::span<IoRequest> requests) = 0;

  // With lazy_buffers: registers fixed_buffers[index] with every ring, if not yet done; a no-op
  // otherwise and for engines without registration (psync). Thread-safe; requests already
  // queued go on as they are. A failure (ENOMEM from RLIMIT_MEMLOCK, a kernel without sparse
  // tables) is returned once, logged once and kept in warning(); registration stops there, later
  // calls return OK, and I/O into unregistered memory goes on with plain READ/WRITE.
  virtual absl::Status register_buffer(uint32_t index) {
    (void)index;
    return absl::OkStatus();
  }

  virtual IoStats stats() const = 0;
};

// io_uring: one ring per worker thread, registered files and buffers, batched submissions.
absl::StatusOr<std::unique_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& options);
// A pool of threads doing pread/pwrite; for machines where io_uring is refused.
absl::StatusOr<std::unique_ptr<IoEngine>> make_psync_engine(const IoEngineOptions& options);

// The one place that turns the requested engine and what io_uring did into a decision, and
// says why (logged at info). auto takes io_uring when the probe passed, else psync with a
// warning; an explicit io_uring the probe refused is FailedPrecondition; psync needs no probe.
// The texts name the setting as `names.engine` does: this floor's words unless the caller
// passes its own (the configuration passes its variable's name).
absl::StatusOr<IoEngineDecision> decide_io_engine(IoEngineKind requested, const IoUringProbe& probe,
                                                  const IoSettingNames& names = {});

// Probes io_uring without files: sets up a ring and completes a READ of its eventfd. The probe
// runs once per process (a ring costs a few milliseconds and kernel memory); later calls return
// that first result, so a report of what the machine offers and every decision made from it
// judge by the same ring.
IoUringProbe probe_io_uring();

struct EngineChoice {
  std::unique_ptr<IoEngine> engine;
  IoEngineDecision decision;  // as made by decide_io_engine, possibly again at start
};
// Starts the engine `decision` names. Under auto, io_uring must also start and complete a real
// 4096-byte read of files[0]; if it does not, the decision is made again with that fact (psync,
// with a warning). An explicit io_uring that cannot start is an error that says how to fall back.
absl::StatusOr<EngineChoice> make_io_engine(const IoEngineDecision& decision,
                                            const IoEngineOptions& options);
// Decides at start: kIoUring or kPsync as asked, kAuto tries io_uring (as above) and falls back.
absl::StatusOr<EngineChoice> make_io_engine(IoEngineKind kind, const IoEngineOptions& options);

// Blocks until every request of a batch has completed; keeps the first error.
class IoWaiter {
 public:
  IoWaiter();
  ~IoWaiter();
  IoWaiter(const IoWaiter&) = delete;
  IoWaiter& operator=(const IoWaiter&) = delete;

  // A callback for one more request.
  IoCallback track();
  absl::Status wait();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace strata
