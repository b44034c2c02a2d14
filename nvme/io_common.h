// What both IoEngines share: request validation, the retry/short-transfer policy, error texts
// and statistics (defined in io_common.cc, which knows no engine). Private to nvme/.
#pragma once

#include <absl/status/status.h>
#include <absl/time/time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/system.h"
#include "strata/nvme/io_engine.h"
#include "strata/testing/fault_injector.h"

namespace strata::io {

// One system call or SQE moves at most this much; longer requests continue where it stopped
// (Linux caps a single read/write at 2 GiB - 4 KiB; io_uring lengths are 32-bit).
inline constexpr uint64_t kMaxAttemptBytes = uint64_t{1} << 30;

using sys::errno_text;  // "Input/output error (errno 5)"; thread-safe

// "write of 4096 bytes at offset 8192 of /mnt/nvme0/swap"
std::string describe(const IoRequest& request, const IoFile& file);

// Rejects a malformed batch before anything is queued, so no callback runs.
absl::Status validate(std::span<const IoRequest> requests, const std::vector<IoFile>& files);

absl::Status check_options(std::string_view engine, const IoEngineOptions& options);

int64_t now_ns();

// Counters shared by an engine's threads; relaxed atomics are enough for statistics.
class StatsCounter {
 public:
  void started() {
    const uint64_t now = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
    uint64_t seen = max_in_flight_.load(std::memory_order_relaxed);
    while (now > seen &&
           !max_in_flight_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  void finished(IoOp op, uint64_t bytes, bool ok, int64_t submitted_ns);
  void retry() { retries_.fetch_add(1, std::memory_order_relaxed); }
  void short_transfer() { short_transfers_.fetch_add(1, std::memory_order_relaxed); }
  void fixed() { fixed_.fetch_add(1, std::memory_order_relaxed); }
  IoStats snapshot() const;

 private:
  std::atomic<uint64_t> reads_{0}, writes_{0}, bytes_read_{0}, bytes_written_{0}, errors_{0},
      retries_{0}, short_transfers_{0}, fixed_{0}, busy_ns_{0}, in_flight_{0}, max_in_flight_{0};
};

// Progress of one request through its attempts; the policy of io_engine.h in one place.
class Attempt {
 public:
  enum class Next { kDone, kResubmit, kFailed };

  Attempt() = default;
  Attempt(IoRequest request, int64_t submitted_ns)
      : request_(std::move(request)), submitted_ns_(submitted_ns) {}

  IoRequest& request() { return request_; }
  // Where the next system call starts and how much it moves.
  uint64_t offset() const { return request_.offset + done_; }
  std::byte* buffer() const { return static_cast<std::byte*>(request_.buffer) + done_; }
  uint64_t length() const;

  // Applies the fault injector (if any) to the raw result of the last attempt, then the retry
  // policy. `engine` names the engine in errors. On kFailed, error() says why.
  // `names` words the hints (which setting to lower).
  Next on_result(int64_t raw, FaultInjector* faults, std::string_view engine, const IoFile& file,
                 const IoSettingNames& names, StatsCounter& stats);

  // Records the request as finished in `stats` (once): engines call it when the request leaves
  // the device, which may be before its callback runs.
  void record(StatsCounter& stats);
  // Runs the callback exactly once and records the request in `stats` if not yet recorded.
  void complete(StatsCounter& stats);
  void complete_with(absl::Status status, StatsCounter& stats);

 private:
  IoRequest request_;
  int64_t submitted_ns_ = 0;
  uint64_t done_ = 0;
  int retries_ = 0;
  bool recorded_ = false;
  absl::Status error_;
};

}  // namespace strata::io
