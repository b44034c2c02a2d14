// The engine choice: decide_io_engine (the one place that picks io_uring or psync and says why),
// the probes it relies on, and make_io_engine. The only file of nvme/ that knows both engines;
// the engines know only io_common.h (helpers <- engines <- choice).
#include <absl/status/status.h>
#include <absl/strings/str_format.h>

#include <cstdlib>
#include <memory>
#include <span>
#include <string>

#include "strata/base/log.h"
#include "strata/nvme/io_engine.h"

namespace strata {
namespace {

constexpr uint64_t kProbeBytes = 4096;

// One real read through a new engine: some sandboxes accept the ring but not READ of a file.
absl::Status probe_read(IoEngine& engine, const IoEngineOptions& options) {
  if (options.files.empty()) return absl::OkStatus();  // ring setup already read an eventfd
  std::unique_ptr<void, decltype(&std::free)> buffer(std::aligned_alloc(kProbeBytes, kProbeBytes),
                                                     &std::free);
  if (buffer == nullptr) return absl::ResourceExhaustedError("no memory for the probe buffer");
  IoWaiter waiter;
  IoRequest request{.op = IoOp::kRead,
                    .file = 0,
                    .offset = 0,
                    .buffer = buffer.get(),
                    .length = kProbeBytes,
                    .done = waiter.track()};
  if (absl::Status s = engine.submit(std::span<IoRequest>(&request, 1)); !s.ok()) return s;
  return waiter.wait();
}

// What a started io_uring engine proved.
std::string passed(const IoEngineOptions& options) {
  return options.files.empty()
             ? std::string("ring set up, a READ of its eventfd completed")
             : absl::StrFormat("%d-byte read of %s", kProbeBytes, options.files[0].name);
}

}  // namespace

absl::StatusOr<IoEngineDecision> decide_io_engine(IoEngineKind requested, const IoUringProbe& probe,
                                                  const IoSettingNames& names) {
  IoEngineDecision d;
  d.requested = requested;
  switch (requested) {
    case IoEngineKind::kPsync:
      d.kind = IoEngineKind::kPsync;
      d.reason = absl::StrFormat("asked for by %s", names.engine);
      break;
    case IoEngineKind::kIoUring:
      if (!probe.available) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "%s is io_uring but io_uring is unavailable here: %s; set it to psync, or to auto to "
            "fall back to psync by itself",
            names.engine, probe.detail));
      }
      d.kind = IoEngineKind::kIoUring;
      d.reason = absl::StrFormat("asked for by %s", names.engine);
      break;
    case IoEngineKind::kAuto:
      if (probe.available) {
        d.kind = IoEngineKind::kIoUring;
        d.reason = absl::StrFormat("auto: the io_uring probe passed (%s)", probe.detail);
      } else {
        d.kind = IoEngineKind::kPsync;
        d.reason = absl::StrFormat("auto: io_uring refused (%s); using psync", probe.detail);
        d.warning = absl::StrFormat(
            "io_uring is unavailable here: %s; NVMe I/O uses psync (a thread pool doing "
            "pread/pwrite), which costs more CPU per GB",
            probe.detail);
      }
      break;
  }
  STRATA_LOG(kInfo, "I/O engine %s: %s", std::string(to_string(d.kind)), d.reason);
  return d;
}

IoUringProbe probe_io_uring() {
  // Once per process (a function-local static is initialised once, even when threads race):
  // strata-info's report and every resolve() then judge by the same ring, started once.
  static const IoUringProbe probe = [] {
    IoEngineOptions options;
    options.depth = 4;
    options.workers = 1;
    absl::StatusOr<std::unique_ptr<IoEngine>> engine = make_uring_engine(options);
    if (!engine.ok()) return IoUringProbe{false, std::string(engine.status().message())};
    return IoUringProbe{true, passed(options)};
  }();
  return probe;
}

namespace {

// Starts io_uring; under auto it must also complete a real read of files[0] (some sandboxes
// accept the ring but not READ of a file). An error says why io_uring was refused.
absl::StatusOr<std::unique_ptr<IoEngine>> start_uring(IoEngineKind requested,
                                                      const IoEngineOptions& options) {
  absl::StatusOr<std::unique_ptr<IoEngine>> uring = make_uring_engine(options);
  if (!uring.ok() || requested != IoEngineKind::kAuto) return uring;
  if (absl::Status s = probe_read(**uring, options); !s.ok()) {
    // Returning destroys the engine, stopping its threads before psync's start.
    return absl::Status(s.code(), absl::StrFormat("the probe read failed: %s", s.message()));
  }
  return uring;
}

// Starts the engine `decision` names. When io_uring is refused at start, the decision is made
// again with that fact (auto: psync with a warning; explicit io_uring: an error that says how to
// fall back). `settled`: decided upstream from the machine's probe, whose reason stands;
// otherwise the reason is what starting proved.
absl::StatusOr<EngineChoice> start_engine(IoEngineDecision decision, const IoEngineOptions& options,
                                          bool settled) {
  EngineChoice choice;
  if (decision.kind == IoEngineKind::kIoUring) {
    absl::StatusOr<std::unique_ptr<IoEngine>> uring = start_uring(decision.requested, options);
    IoUringProbe found{uring.ok(),
                       uring.ok() ? passed(options) : std::string(uring.status().message())};
    if (!uring.ok() || !settled) {
      absl::StatusOr<IoEngineDecision> d =
          decide_io_engine(decision.requested, found, options.names);
      if (!d.ok()) return absl::Status(uring.status().code(), d.status().message());
      decision = *std::move(d);
    }
    if (uring.ok()) {
      choice.engine = *std::move(uring);
      choice.decision = std::move(decision);
      STRATA_LOG(kDebug, "started the io_uring engine: %d file(s), depth %d, %s",
                 options.files.size(), options.depth, choice.decision.reason);
      return choice;
    }
  } else if (!settled) {
    absl::StatusOr<IoEngineDecision> d =
        decide_io_engine(IoEngineKind::kPsync, IoUringProbe{}, options.names);
    if (!d.ok()) return d.status();
    decision = *std::move(d);
  }
  absl::StatusOr<std::unique_ptr<IoEngine>> psync = make_psync_engine(options);
  if (!psync.ok()) return psync.status();
  choice.engine = *std::move(psync);
  choice.decision = std::move(decision);
  STRATA_LOG(kDebug, "started the psync engine: %d file(s), depth %d, %s", options.files.size(),
             options.depth, choice.decision.reason);
  return choice;
}

}  // namespace

absl::StatusOr<EngineChoice> make_io_engine(const IoEngineDecision& decision,
                                            const IoEngineOptions& options) {
  return start_engine(decision, options, /*settled=*/true);
}

absl::StatusOr<EngineChoice> make_io_engine(IoEngineKind kind, const IoEngineOptions& options) {
  // No probe upstream: starting io_uring (and under auto its read) is the probe.
  IoEngineDecision pending;
  pending.requested = kind;
  pending.kind = kind == IoEngineKind::kPsync ? IoEngineKind::kPsync : IoEngineKind::kIoUring;
  return start_engine(pending, options, /*settled=*/false);
}

}  // namespace strata
