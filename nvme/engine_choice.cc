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
  IoEngineOptions options;
  options.depth = 4;
  options.workers = 1;
  absl::StatusOr<std::unique_ptr<IoEngine>> engine = make_uring_engine(options);
  if (!engine.ok()) return IoUringProbe{false, std::string(engine.status().message())};
  return IoUringProbe{true, passed(options)};
}

absl::StatusOr<EngineChoice> make_io_engine(const IoEngineDecision& decision,
                                            const IoEngineOptions& options) {
  EngineChoice choice;
  choice.decision = decision;
  if (decision.kind == IoEngineKind::kIoUring) {
    // Asked for, or chosen by auto from an earlier probe: start it, and under auto prove it
    // with a real read of the first file, falling back when it fails.
    const bool automatic = decision.requested == IoEngineKind::kAuto;
    absl::StatusOr<std::unique_ptr<IoEngine>> uring = make_uring_engine(options);
    absl::Status refused = uring.status();
    if (uring.ok() && automatic) {
      if (absl::Status s = probe_read(**uring, options); !s.ok()) {
        refused = absl::Status(s.code(), absl::StrFormat("the probe read failed: %s", s.message()));
        uring->reset();  // stop its threads before starting psync's
      }
    }
    if (refused.ok()) {
      if (choice.decision.reason.empty()) {  // decided here, not upstream: say what it proved
        absl::StatusOr<IoEngineDecision> d = decide_io_engine(
            decision.requested, IoUringProbe{true, passed(options)}, options.names);
        if (!d.ok()) return d.status();
        choice.decision = *std::move(d);
      }
      choice.engine = *std::move(uring);
      STRATA_LOG(kDebug, "started the io_uring engine: %d file(s), depth %d, %s",
                 options.files.size(), options.depth, choice.decision.reason);
      return choice;
    }
    // Explicit io_uring: an error that says how to fall back. Auto: psync, with a warning.
    absl::StatusOr<IoEngineDecision> d = decide_io_engine(
        decision.requested, IoUringProbe{false, std::string(refused.message())}, options.names);
    if (!d.ok()) return absl::Status(refused.code(), d.status().message());
    choice.decision = *std::move(d);
  } else if (choice.decision.reason.empty()) {
    absl::StatusOr<IoEngineDecision> d =
        decide_io_engine(IoEngineKind::kPsync, IoUringProbe{}, options.names);
    if (!d.ok()) return d.status();
    choice.decision = *std::move(d);
  }
  absl::StatusOr<std::unique_ptr<IoEngine>> psync = make_psync_engine(options);
  if (!psync.ok()) return psync.status();
  choice.engine = *std::move(psync);
  STRATA_LOG(kDebug, "started the psync engine: %d file(s), depth %d, %s", options.files.size(),
             options.depth, choice.decision.reason);
  return choice;
}

absl::StatusOr<EngineChoice> make_io_engine(IoEngineKind kind, const IoEngineOptions& options) {
  IoEngineDecision pending;  // its reason is filled in once the engine has started
  pending.requested = kind;
  pending.kind = kind == IoEngineKind::kPsync ? IoEngineKind::kPsync : IoEngineKind::kIoUring;
  return make_io_engine(pending, options);
}

}  // namespace strata
