// IoEngineKind: which engine moves the NVMe tier's bytes, and the decision the NVMe floor makes
// (IoEngineDecision). A header without the engines (like KvikIO's compat_mode.hpp) so that the
// configuration can hold and print the choice without them.
#pragma once

#include <string>
#include <string_view>

namespace strata {

// auto: io_uring where it works, else psync (decided by decide_io_engine in io_engine.h).
enum class IoEngineKind { kAuto, kIoUring, kPsync };

// "auto", "io_uring", "psync".
std::string_view to_string(IoEngineKind engine);

// What the machine offers: the io_uring probe's result, a real ring and a request through it,
// and in words what worked or why not ("io_uring_queue_init: Operation not permitted (errno 1)
// — seccomp ...").
struct IoUringProbe {
  bool available = false;
  std::string detail;
};

// Which engine runs and why, in words a user can check: what decide_io_engine (io_engine.h)
// made of the requested kind and the probe. The one value every floor passes on.
struct IoEngineDecision {
  IoEngineKind requested = IoEngineKind::kAuto;  // what was asked for
  IoEngineKind kind = IoEngineKind::kPsync;      // kIoUring or kPsync, never kAuto
  std::string reason;   // "auto: the io_uring probe passed (...)", "asked for by ..."
  std::string warning;  // set when auto fell back to psync: it works, at more CPU per GB
};

}  // namespace strata
