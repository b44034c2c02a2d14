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
  std::optional<GpuInfo> gpu;  // the selected GPU when backend is kCuda
};

// `auto` picks CUDA when this build has it and a device is visible, else host. Asking for
// `cuda` where it cannot be had is an error naming STRATA_BACKEND / STRATA_DEVICE.
absl::StatusOr<BackendChoice> choose_backend(Backend requested, int device_ordinal);

// True when this library was built with the CUDA backend.
bool built_with_cuda();

// Creates the device for a resolved configuration (backend must be kCuda or kHost).
absl::StatusOr<std::unique_ptr<Device>> make_device(Backend backend, int device_ordinal);

}  // namespace strata
