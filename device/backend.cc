#include "strata/device/backend.h"

#include <absl/strings/str_format.h>

#include <filesystem>
#include <system_error>

#include "strata/device/host_device.h"

#if defined(STRATA_HAVE_CUDA)
#include "cuda_device.h"
#endif

namespace strata {

bool built_with_cuda() {
#if defined(STRATA_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

namespace {

// The number of visible CUDA devices (at least 1), or why CUDA cannot be used.
absl::StatusOr<int> probe_cuda() {
#if defined(STRATA_HAVE_CUDA)
  auto count = cuda_device_count();
  if (!count.ok()) {
    // Without a driver the runtime reports "driver version is insufficient", which misleads.
    if (std::error_code error; !std::filesystem::exists("/proc/driver/nvidia/version", error)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no NVIDIA driver is loaded (no /proc/driver/nvidia/version; CUDA says: %s)",
          count.status().message()));
    }
    return count.status();
  }
  if (*count == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  return *count;
#else
  return absl::FailedPreconditionError(
      "this strata build has no CUDA backend (CUDA toolkit not found at build time)");
#endif
}

}  // namespace

absl::StatusOr<GpuInfo> gpu_info([[maybe_unused]] int ordinal) {
#if defined(STRATA_HAVE_CUDA)
  return cuda_device_info(ordinal);
#else
  return absl::FailedPreconditionError(
      "this strata build has no CUDA backend (CUDA toolkit not found at build time)");
#endif
}

absl::StatusOr<BackendChoice> choose_backend(Backend requested) {
  BackendChoice choice;
  switch (requested) {
    case Backend::kHost:
      choice.backend = Backend::kHost;
      choice.reason = "STRATA_BACKEND=host";
      return choice;
    case Backend::kCuda: {
      absl::StatusOr<int> count = probe_cuda();
      if (!count.ok()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "STRATA_BACKEND=cuda but CUDA cannot be used: %s; set STRATA_BACKEND=auto or host",
            count.status().message()));
      }
      choice.backend = Backend::kCuda;
      choice.reason = "STRATA_BACKEND=cuda";
      choice.device_count = *count;
      return choice;
    }
    case Backend::kAuto: {
      absl::StatusOr<int> count = probe_cuda();
      if (count.ok()) {
        choice.backend = Backend::kCuda;
        choice.reason = absl::StrFormat("STRATA_BACKEND=auto: %d CUDA device%s visible", *count,
                                        *count == 1 ? " is" : "s are");
        choice.device_count = *count;
        return choice;
      }
      choice.backend = Backend::kHost;
      choice.reason =
          absl::StrFormat("STRATA_BACKEND=auto: %s, so the host backend simulates the device",
                          count.status().message());
      return choice;
    }
  }
  return absl::InvalidArgumentError("unknown backend");
}

absl::StatusOr<BackendChoice> choose_backend(Backend requested, int device_ordinal) {
  absl::StatusOr<BackendChoice> choice = choose_backend(requested);
  if (!choice.ok() || choice->backend != Backend::kCuda) return choice;
  if (device_ordinal < 0 || device_ordinal >= choice->device_count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("STRATA_DEVICE=%d but %d CUDA device(s) are visible: use 0..%d (check "
                        "CUDA_VISIBLE_DEVICES)",
                        device_ordinal, choice->device_count, choice->device_count - 1));
  }
  absl::StatusOr<GpuInfo> gpu = gpu_info(device_ordinal);
  if (!gpu.ok()) return gpu.status();
  choice->gpu = *std::move(gpu);
  return choice;
}

absl::StatusOr<std::unique_ptr<Device>> make_device(Backend backend,
                                                    [[maybe_unused]] int device_ordinal) {
  switch (backend) {
    case Backend::kHost:
      return make_host_device();
    case Backend::kCuda:
#if defined(STRATA_HAVE_CUDA)
      return make_cuda_device(device_ordinal);
#else
      return absl::FailedPreconditionError(
          "this strata build has no CUDA backend; set STRATA_BACKEND=host or rebuild with CUDA");
#endif
    case Backend::kAuto:
      break;
  }
  return absl::InvalidArgumentError("make_device needs a chosen backend (cuda or host), not auto");
}

std::string_view to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCuda:
      return "cuda";
    case Backend::kHost:
      return "host";
  }
  return "invalid";
}

}  // namespace strata
