// The README's "embed it in a trainer" loop, run as a test: a Runtime from the configuration,
// layers created once, acquired and released in order inside steps, their bytes intact.
#include "strata/runtime/runtime.h"

#include <absl/strings/str_format.h>

#include <cstring>
#include <filesystem>

#include "device/device_fixtures.h"

namespace strata {
namespace {

TEST_CASE("A toy training loop through Runtime and TensorStore", "[runtime]") {
  std::string dir = (std::filesystem::temp_directory_path() / "strata-runtime-XXXXXX").string();
  REQUIRE(mkdtemp(dir.data()) != nullptr);
  auto config = Config::from_variables({{"STRATA_BACKEND", "host"},
                                        {"STRATA_GPU_BYTES", "4MiB"},
                                        {"STRATA_CPU_BYTES", "16MiB"},
                                        {"STRATA_NVME_PATHS", dir},
                                        {"STRATA_NVME_BYTES", "32MiB"},
                                        {"STRATA_IO_BLOCK", "256KiB"},
                                        {"STRATA_STAGING_BYTES", "2MiB"}});
  REQUIRE(config.ok());
  auto runtime = Runtime::create(*config);
  REQUIRE(runtime.ok());
  TensorStore& store = (*runtime)->store();
  Device& device = (*runtime)->device();
  auto stream = device.create_stream();
  REQUIRE(stream.ok());

  constexpr int kLayers = 8;
  constexpr uint64_t kBytes = 1 << 20;  // 8 MiB of layers through a 4 MiB GPU arena
  std::vector<TensorHandle> layers;
  for (int i = 0; i < kLayers; ++i) {
    auto layer = store.create(absl::StrFormat("layer%d.weight", i), kBytes, TierKind::kNvme);
    REQUIRE(layer.ok());
    auto cpu = store.acquire(*layer, TierKind::kCpu, **stream, AccessMode::kWrite);
    REQUIRE(cpu.ok());
    std::memset(*cpu, i + 1, kBytes);  // initialise on the host
    REQUIRE(store.release(*layer, **stream).ok());
    layers.push_back(*layer);
  }
  auto check = device.allocate_pinned(kBytes, "check");
  REQUIRE(check.ok());
  auto* host = static_cast<unsigned char*>((*check)->data());
  for (int step = 0; step < 3; ++step) {
    store.step_begin();
    for (int i = 0; i < kLayers; ++i) {  // forward; a trainer would launch kernels here
      auto weight = store.acquire(layers[i], TierKind::kGpu, **stream, AccessMode::kRead);
      REQUIRE(weight.ok());
      REQUIRE(device.copy_async(host, *weight, kBytes, CopyKind::kDeviceToHost, **stream).ok());
      REQUIRE(store.release(layers[i], **stream).ok());
      REQUIRE(device.synchronize(**stream).ok());
      CHECK(host[0] == i + 1);
      CHECK(host[kBytes - 1] == i + 1);
    }
    store.step_end();
  }
  const StoreStats stats = store.stats();
  CHECK(stats.schedule.has_trace);
  CHECK(stats.errors == 0);
  CHECK(stats.tiers[2].present);
  runtime->reset();
  CHECK(std::filesystem::is_empty(dir));  // the swap file had no name
  std::filesystem::remove_all(dir);
}

TEST_CASE("Runtime refuses a configuration that cannot work", "[runtime]") {
  auto config = Config::from_variables(
      {{"STRATA_BACKEND", "host"}, {"STRATA_GPU_BYTES", "4MiB"}, {"STRATA_CPU_BYTES", "16MiB"}});
  REQUIRE(config.ok());
  RuntimeOptions options;
  HostDeviceOptions small;
  small.memory_bytes = 1 << 20;  // less than STRATA_GPU_BYTES
  options.device = testing::host_device(small);
  auto runtime = Runtime::create(*config, std::move(options));
  REQUIRE_FALSE(runtime.ok());
  CHECK_THAT(std::string(runtime.status().message()), Catch::Contains("STRATA_GPU_BYTES"));
}

TEST_CASE("Runtime tells its device what its GPU arena assumed", "[runtime][gpu-sharing]") {
  // The host backend's arena is host memory: nothing assumed, whatever the device said before.
  auto host = Config::from_variables(
      {{"STRATA_BACKEND", "host"}, {"STRATA_GPU_BYTES", "4MiB"}, {"STRATA_CPU_BYTES", "16MiB"}});
  REQUIRE(host.ok());
  RuntimeOptions options;
  options.device = testing::host_device();
  options.device->set_budget_sharing(5);
  auto runtime = Runtime::create(*host, std::move(options));
  REQUIRE(runtime.ok());
  CHECK((*runtime)->device().budget_sharing() == 0);
}

TEST_CASE("Runtime tells its CUDA device that its arena is half a GPU",
          "[runtime][gpu-sharing][cuda]") {
  // Two local ranks, neither LOCAL_RANK nor STRATA_DEVICE set, so both on device 0; the arena
  // (a percentage) is half a GPU's share, and the device says so.
  if (testing::cuda_device_or_skip() == nullptr) return;
  auto cuda = Config::from_variables({{"STRATA_BACKEND", "cuda"},
                                      {"STRATA_GPU_BYTES", "1%"},
                                      {"STRATA_CPU_BYTES", "16MiB"},
                                      {"LOCAL_WORLD_SIZE", "2"}});
  REQUIRE(cuda.ok());
  auto on_gpu = Runtime::create(*cuda);
  INFO(on_gpu.status());
  REQUIRE(on_gpu.ok());
  CHECK((*on_gpu)->config().gpu_budget_sharing == 2);
  CHECK((*on_gpu)->device().budget_sharing() == 2);
}

}  // namespace
}  // namespace strata
