// What the device layer learns of a GPU: dependency-free, so that the machine facts (which record
// it) and the devices (which produce it) can both name it.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct GpuInfo {
  int ordinal = 0;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

}  // namespace strata
