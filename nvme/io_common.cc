// What both IoEngines share (io_common.h): request validation, the retry/short-transfer policy,
// error texts and statistics; also the enum names and the one depth check of io_engine.h.
#include "io_common.h"

#include <absl/status/status.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "strata/testing/fault_injector.h"

namespace strata {

std::string_view to_string(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

std::string_view to_string(IoEngineKind engine) {
  switch (engine) {
    case IoEngineKind::kAuto:
      return "auto";
    case IoEngineKind::kIoUring:
      return "io_uring";
    case IoEngineKind::kPsync:
      return "psync";
  }
  return "invalid";
}

absl::Status check_io_depth(int64_t depth) {
  if (depth < 1 || depth > int64_t{kMaxIoDepth}) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d is out of range: use an integer from 1 to %d", depth, kMaxIoDepth));
  }
  return absl::OkStatus();
}

namespace io {
namespace {

// What a user can do about an errno from a read or write of a swap file.
std::string hint(int err, const IoSettingNames& names) {
  switch (err) {
    case EIO:
      return "; the drive reported an I/O error: check `dmesg` and the drive's health "
             "(smartctl -a, nvme smart-log)";
    case ENOSPC:
      return absl::StrFormat("; the file system is full: free space there or lower %s",
                             names.bytes_per_path);
    case EINVAL:
      return "; O_DIRECT needs the buffer address, offset and length aligned to the device's "
             "logical block size (statx STATX_DIOALIGN)";
    case EBADF:
      return "; the file descriptor is closed or not open for this operation";
    case EFAULT:
      return "; the buffer is not valid memory for the whole length";
    default:
      return "";
  }
}

std::string progress(uint64_t done) {
  return done == 0 ? std::string() : absl::StrFormat(" after %d bytes", done);
}

}  // namespace

std::string describe(const IoRequest& request, const IoFile& file) {
  return absl::StrFormat("%s of %d bytes at offset %d of %s", std::string(to_string(request.op)),
                         request.length, request.offset, file.name);
}

absl::Status validate(std::span<const IoRequest> requests, const std::vector<IoFile>& files) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    const std::string which =
        absl::StrFormat("I/O request %d of %d (%s at offset %d)", i, requests.size(),
                        std::string(to_string(r.op)), r.offset);
    if (r.file >= files.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: file index %d is out of range; the engine has %d file(s)", which,
                          r.file, files.size()));
    }
    if (r.buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: the buffer is null", which));
    }
    if (r.length == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the length is 0; every request must move at least one byte", which));
    }
    if (r.offset > UINT64_MAX - r.length) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: offset + length (%d bytes) overflows", which, r.length));
    }
    if (!r.done) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: it has no completion callback", which));
    }
  }
  return absl::OkStatus();
}

absl::Status check_options(std::string_view engine, const IoEngineOptions& options) {
  if (absl::Status s = check_io_depth(options.depth); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s engine: %s %s", std::string(engine), options.names.depth, s.message()));
  }
  for (size_t i = 0; i < options.files.size(); ++i) {
    if (options.files[i].fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s engine: file %d (%s) has no open descriptor (fd %d)",
                          std::string(engine), i, options.files[i].name, options.files[i].fd));
    }
  }
  return absl::OkStatus();
}

int64_t now_ns() { return absl::GetCurrentTimeNanos(); }

void StatsCounter::finished(IoOp op, uint64_t bytes, bool ok, int64_t submitted_ns) {
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  busy_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, now_ns() - submitted_ns)),
                     std::memory_order_relaxed);
  if (!ok) {
    errors_.fetch_add(1, std::memory_order_relaxed);
  } else if (op == IoOp::kRead) {
    reads_.fetch_add(1, std::memory_order_relaxed);
    bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    writes_.fetch_add(1, std::memory_order_relaxed);
    bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  }
}

IoStats StatsCounter::snapshot() const {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  IoStats s;
  s.reads = reads_.load(kRelaxed);
  s.writes = writes_.load(kRelaxed);
  s.bytes_read = bytes_read_.load(kRelaxed);
  s.bytes_written = bytes_written_.load(kRelaxed);
  s.errors = errors_.load(kRelaxed);
  s.retries = retries_.load(kRelaxed);
  s.short_transfers = short_transfers_.load(kRelaxed);
  s.fixed_requests = fixed_.load(kRelaxed);
  s.busy_ns = busy_ns_.load(kRelaxed);
  s.max_in_flight = max_in_flight_.load(kRelaxed);
  return s;
}

uint64_t Attempt::length() const { return std::min(request_.length - done_, kMaxAttemptBytes); }

Attempt::Next Attempt::on_result(int64_t raw, FaultInjector* faults, std::string_view engine,
                                 const IoFile& file, const IoSettingNames& names,
                                 StatsCounter& stats) {
  int64_t res = raw;
  if (faults != nullptr) {
    const FaultInjector::Decision decision = faults->apply(request_.op, request_.file, raw);
    if (decision.delay > absl::ZeroDuration()) absl::SleepFor(decision.delay);
    res = decision.result;
  }
  const std::string what = absl::StrFormat("%s %s", std::string(engine), describe(request_, file));
  if (res < 0) {
    const int err = static_cast<int>(-res);
    if (err == EAGAIN || err == EINTR) {
      if (retries_ < IoEngine::kMaxRetries) {
        ++retries_;
        stats.retry();
        return Next::kResubmit;
      }
      error_ = absl::UnavailableError(absl::StrFormat(
          "%s failed%s: still %s after %d retries; the device or kernel is overloaded: lower %s "
          "or check the drive",
          what, progress(done_), errno_text(err), IoEngine::kMaxRetries, names.depth));
      return Next::kFailed;
    }
    // absl maps EIO to kUnknown; the drive failing to move the bytes is data loss to callers.
    error_ = absl::Status(err == EIO ? absl::StatusCode::kDataLoss : absl::ErrnoToStatusCode(err),
                          absl::StrFormat("%s failed%s: %s%s", what, progress(done_),
                                          errno_text(err), hint(err, names)));
    return Next::kFailed;
  }
  if (res == 0) {
    if (request_.op == IoOp::kRead) {
      error_ = absl::OutOfRangeError(absl::StrFormat(
          "%s failed: unexpected end of file%s; the file is shorter than the request (was it "
          "truncated, or not preallocated?)",
          what, progress(done_)));
    } else {
      error_ = absl::InternalError(absl::StrFormat(
          "%s failed%s: the kernel accepted 0 bytes, so the write cannot make progress", what,
          progress(done_)));
    }
    return Next::kFailed;
  }
  const uint64_t want = length();
  const uint64_t got = std::min(static_cast<uint64_t>(res), want);
  done_ += got;
  if (done_ == request_.length) return Next::kDone;
  if (got < want) stats.short_transfer();
  return Next::kResubmit;
}

void Attempt::record(StatsCounter& stats) {
  if (recorded_) return;
  recorded_ = true;
  stats.finished(request_.op, request_.length, error_.ok(), submitted_ns_);
}

void Attempt::complete(StatsCounter& stats) {
  if (!error_.ok()) {
    complete_with(std::move(error_), stats);
    return;
  }
  record(stats);
  std::move(request_.done)(absl::OkStatus());
}

void Attempt::complete_with(absl::Status status, StatsCounter& stats) {
  if (!recorded_) {
    recorded_ = true;
    stats.finished(request_.op, request_.length, status.ok(), submitted_ns_);
  }
  std::move(request_.done)(std::move(status));
}

}  // namespace io

}  // namespace strata
