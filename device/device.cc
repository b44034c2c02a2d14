#include "strata/device/device.h"

#include <absl/strings/str_format.h>

#include <cstdlib>

#include "strata/base/size.h"

namespace strata {

std::string_view to_string(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "host-to-device";
    case CopyKind::kDeviceToHost:
      return "device-to-host";
    case CopyKind::kDeviceToDevice:
      return "device-to-device";
  }
  return "unknown";
}

std::string_view to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kRegisteredHost:
      return "registered host";
    case MemoryKind::kDevice:
      return "device";
  }
  return "unknown";
}

void PinnedHostMemory::FreeDeleter::operator()(void* p) const { std::free(p); }

PinnedHostMemory::~PinnedHostMemory() = default;

absl::StatusOr<std::unique_ptr<PinnedHostMemory>> Device::allocate_pinned(uint64_t bytes,
                                                                          std::string_view what) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: cannot allocate 0 bytes", what));
  }
  const uint64_t rounded = (bytes + PinnedHostMemory::kAlignment - 1) /
                           PinnedHostMemory::kAlignment * PinnedHostMemory::kAlignment;
  std::unique_ptr<void, PinnedHostMemory::FreeDeleter> data(
      std::aligned_alloc(PinnedHostMemory::kAlignment, rounded));
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: cannot allocate %s of host memory; lower the size (STRATA_CPU_BYTES or "
        "STRATA_STAGING_BYTES) or free memory on this machine",
        what, format_bytes(rounded)));
  }
  auto registration = register_host(data.get(), rounded);
  if (!registration.ok()) {
    return absl::Status(registration.status().code(),
                        absl::StrFormat("%s: %s", what, registration.status().message()));
  }
  return std::make_unique<PinnedHostMemory>(PinnedHostMemory::Key(), std::move(data), rounded,
                                            *std::move(registration));
}

}  // namespace strata
