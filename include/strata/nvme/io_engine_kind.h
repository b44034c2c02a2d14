// IoEngineKind: which engine moves the NVMe tier's bytes. A dependency-free header (like
// KvikIO's compat_mode.hpp) so that configuration can name the choice without the engines.
#pragma once

#include <string_view>

namespace strata {

// auto: io_uring where it works, else psync (decided by decide_io_engine in io_engine.h).
enum class IoEngineKind { kAuto, kIoUring, kPsync };

// "auto", "io_uring", "psync".
std::string_view to_string(IoEngineKind engine);

}  // namespace strata
