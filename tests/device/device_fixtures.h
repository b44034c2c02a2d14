// Runs one test body on every backend: HostDevice always, CudaDevice when a GPU is visible.
// Without a GPU the [cuda] variant prints "SKIPPED: ..." and CTest reports it as skipped.
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "skip.h"
#include "strata/device/backend.h"
#include "strata/device/host_device.h"

namespace strata::testing {

inline std::unique_ptr<Device> host_device(HostDeviceOptions options = {}) {
  auto device = make_host_device(options);
  REQUIRE(device.ok());
  return *std::move(device);
}

// The CUDA device, or nullptr after printing why the test is skipped.
inline std::unique_ptr<Device> cuda_device_or_skip() {
  auto choice = choose_backend(Backend::kCuda, 0);
  if (!choice.ok()) {
    skip("no CUDA device: " + std::string(choice.status().message()));
    return nullptr;
  }
  auto device = make_device(Backend::kCuda, 0);
  REQUIRE(device.ok());
  return *std::move(device);
}

}  // namespace strata::testing

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

// STRATA_BOTH_BACKENDS("name", "[tags]") { ... uses `Device& device` ... }
#define STRATA_BOTH_BACKENDS(name, tags) \
  STRATA_BOTH_BACKENDS_IMPL(name, tags, STRATA_CONCAT(strata_backend_test_, __LINE__))
#define STRATA_BOTH_BACKENDS_IMPL(name, tags, fn)         \
  static void fn(::strata::Device& device);               \
  TEST_CASE(name " (host)", tags) {                       \
    auto host = ::strata::testing::host_device();         \
    fn(*host);                                            \
  }                                                       \
  TEST_CASE(name " (cuda)", "[cuda]") {                   \
    auto cuda = ::strata::testing::cuda_device_or_skip(); \
    if (cuda != nullptr) fn(*cuda);                       \
  }                                                       \
  static void fn([[maybe_unused]] ::strata::Device& device)
