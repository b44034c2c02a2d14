// Choosing a device backend and creating the device.
#pragma once

#include <absl/status/statusor.h>

#include <memory>
#include <optional>
#include <string>

#include "strata/device/backend_kind.h"
#include "strata/device/device.h"
#include "strata/device/gpu_info.h"

namespace strata {

struct BackendChoice {
  Backend backend = Backend::kHost;
  std::string reason;          // why, in words a user can check ("STRATA_BACKEND=host", ...)
  int device_count = 0;        // visible CUDA devices when backend is kCuda; else 0
  std::optional<GpuInfo> gpu;  // the selected GPU (two-argument form only)
};

// `auto` picks CUDA when this build has it and a device is visible, else host. Asking for
// `cuda` where it cannot be had is an error naming STRATA_BACKEND. Selects no device: which one
// is the configuration's choice (choose_device in strata/config/config.h, by STRATA_DEVICE or
// LOCAL_RANK), made knowing device_count; gpu_info() then gives its facts.
absl::StatusOr<BackendChoice> choose_backend(Backend requested);

// The same, then the facts of `device_ordinal`, which must be visible (an error naming
// STRATA_DEVICE and CUDA_VISIBLE_DEVICES otherwise). For tests and tools that want device N.
absl::StatusOr<BackendChoice> choose_backend(Backend requested, int device_ordinal);

// Name, memory and compute capability of visible CUDA device `ordinal` (0 .. device_count-1).
absl::StatusOr<GpuInfo> gpu_info(int ordinal);

// True when this library was built with the CUDA backend.
bool built_with_cuda();

// Creates the device for a resolved configuration (backend must be kCuda or kHost).
absl::StatusOr<std::unique_ptr<Device>> make_device(Backend backend, int device_ordinal);

}  // namespace strata
