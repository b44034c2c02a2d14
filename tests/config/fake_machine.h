// Machines with known facts for resolve() tests, filled by hand as the device layer would.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "strata/config/config.h"
#include "strata/config/machine_info.h"

namespace strata::testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

inline bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// 64 GiB, io_uring, host backend, no paths.
inline MachineInfo fake_machine() {
  MachineInfo m;
  m.physical_memory_bytes = 64 * kGiB;
  m.physical_memory_source = "test";
  m.available_memory_bytes = 60 * kGiB;
  m.cpu_count = 8;
  m.memlock_limit_bytes = std::numeric_limits<uint64_t>::max();
  m.io_uring.available = true;
  m.io_uring.detail = "test ring";
  m.backend = Backend::kHost;
  m.backend_reason = "test: host";
  return m;
}

// The cuda backend with one visible GPU (device 0: 80 GiB, 70 GiB free).
inline MachineInfo fake_cuda_machine() {
  MachineInfo m = fake_machine();
  m.backend = Backend::kCuda;
  m.backend_reason = "test: GPU 0 visible";
  m.gpu = GpuInfo{0, "Test GPU", 80 * kGiB, 70 * kGiB, 9, 0};
  m.gpu_count = 1;
  return m;
}

inline PathInfo fake_path(std::string path, uint64_t free_bytes) {
  PathInfo p;
  p.path = std::move(path);
  p.exists = p.is_directory = p.writable = true;
  p.free_bytes = free_bytes;
  p.total_bytes = 4 * free_bytes;
  p.logical_block_size = 512;
  p.block_size_known = true;
  p.filesystem = "xfs";
  return p;
}

inline ResolvedConfig resolved_of(const Config& config, const MachineInfo& machine) {
  absl::StatusOr<ResolvedConfig> r = resolve(config, machine);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

inline std::string resolve_error(const Config& config, const MachineInfo& machine) {
  absl::StatusOr<ResolvedConfig> r = resolve(config, machine);
  REQUIRE_FALSE(r.ok());
  return std::string(r.status().message());
}

}  // namespace strata::testing
