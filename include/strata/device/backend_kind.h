// Backend: which device layer runs strata. A dependency-free header (like KvikIO's
// compat_mode.hpp) so that the device interface, the machine facts and the configuration can
// name it without including each other.
#pragma once

#include <string_view>

namespace strata {

// auto: CUDA where this build has it and a device is visible, else host (choose_backend).
enum class Backend { kAuto, kCuda, kHost };

// "auto", "cuda", "host".
std::string_view to_string(Backend backend);

}  // namespace strata
