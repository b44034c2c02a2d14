// CudaDevice: the Device on an NVIDIA GPU through the CUDA runtime. The only strata code that
// includes CUDA headers is its .cc; this header stays CUDA-free.
#pragma once

#include <absl/status/statusor.h>

#include <memory>

#include "strata/device/device.h"
#include "strata/device/gpu_info.h"

namespace strata {

// Number of visible CUDA devices, or an error saying why none can be used.
absl::StatusOr<int> cuda_device_count();
absl::StatusOr<GpuInfo> cuda_device_info(int ordinal);
absl::StatusOr<std::unique_ptr<Device>> make_cuda_device(int ordinal);

}  // namespace strata
