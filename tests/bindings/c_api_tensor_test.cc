// The C API's tensors and streams: bytes round-trip through every tier and the stats say so;
// dtype, shape and name come back; steps and an access order drive the scheduler; destroy frees
// a tensor's copies in every tier.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "c_api_fixtures.h"
#include "strata/strata.h"
#include "temp_dir.h"

namespace strata::testing {
namespace {

TEST_CASE("c_api: bytes round-trip through every tier, and the stats say so", "[c_api]") {
  strata::testing::TempDir dir("strata-c-api");
  TestRuntime rt(nvme_vars(dir.path()));
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));

  constexpr uint64_t kBytes = 200 * kKiB + 3;  // not a whole number of blocks
  strata_tensor_t on_nvme{};
  strata_tensor_t on_cpu{};
  REQUIRE_OK(strata_tensor_create(r, "layer0.weight", kBytes, STRATA_TIER_NVME, &on_nvme));
  REQUIRE_OK(strata_tensor_create(r, "layer1.weight", kBytes, STRATA_TIER_CPU, &on_cpu));

  // CPU write, write-back to NVMe on evict, then NVMe → GPU.
  write_through(on_nvme, STRATA_TIER_CPU, s, kBytes, 1);
  REQUIRE_OK(strata_tensor_evict(on_nvme, STRATA_TIER_CPU));
  CHECK(read_through(on_nvme, STRATA_TIER_GPU, s, kBytes, 1));
  // GPU write, write-back through staging on evict, then back to the CPU.
  write_through(on_nvme, STRATA_TIER_GPU, s, kBytes, 2);
  REQUIRE_OK(strata_tensor_evict(on_nvme, STRATA_TIER_GPU));
  CHECK(read_through(on_nvme, STRATA_TIER_CPU, s, kBytes, 2));
  // Prefetch, then a hit.
  REQUIRE_OK(strata_tensor_evict(on_nvme, STRATA_TIER_CPU));
  REQUIRE_OK(strata_tensor_prefetch(on_nvme, STRATA_TIER_GPU));
  CHECK(read_through(on_nvme, STRATA_TIER_GPU, s, kBytes, 2));
  // CPU-homed: GPU write made home by flush.
  write_through(on_cpu, STRATA_TIER_CPU, s, kBytes, 3);
  write_through(on_cpu, STRATA_TIER_GPU, s, kBytes, 4);
  REQUIRE_OK(strata_runtime_flush(r));
  REQUIRE_OK(strata_tensor_evict(on_cpu, STRATA_TIER_GPU));
  CHECK(read_through(on_cpu, STRATA_TIER_CPU, s, kBytes, 4));

  strata_stats_t stats;
  REQUIRE_OK(strata_runtime_stats(r, &stats));
  CHECK(stats.tensors == 2);
  CHECK(stats.tiers[STRATA_TIER_GPU].present == 1);
  CHECK(stats.tiers[STRATA_TIER_GPU].capacity > 0);
  CHECK(stats.tiers[STRATA_TIER_GPU].capacity <= 1024 * kKiB);
  CHECK(stats.tiers[STRATA_TIER_CPU].present == 1);
  CHECK(stats.tiers[STRATA_TIER_NVME].present == 1);
  CHECK(stats.tiers[STRATA_TIER_NVME].capacity > 0);
  CHECK(stats.tiers[STRATA_TIER_NVME].used >= kBytes);
  CHECK(stats.acquires == 8);
  CHECK(stats.hits + stats.misses == stats.acquires);
  CHECK(stats.moves[STRATA_TIER_CPU][STRATA_TIER_NVME].moves >= 1);
  CHECK(stats.moves[STRATA_TIER_CPU][STRATA_TIER_NVME].bytes >= kBytes);
  CHECK(stats.moves[STRATA_TIER_NVME][STRATA_TIER_GPU].bytes +
            stats.moves[STRATA_TIER_NVME][STRATA_TIER_CPU].bytes >=
        2 * kBytes);
  CHECK(stats.moves[STRATA_TIER_GPU][STRATA_TIER_CPU].bytes >= kBytes);
  CHECK(stats.prefetches_issued + stats.prefetches_late >= 1);  // the acquire may beat the mover
  CHECK(stats.errors == 0);
  CHECK(stats.evictions_writeback >= 2);
  CHECK(stats.prefetch_accuracy >= 0.0);
  CHECK(stats.prefetch_accuracy <= 1.0);

  size_t length = 0;
  REQUIRE_OK(strata_runtime_describe(r, nullptr, 0, &length));
  std::string text(length, '\0');
  REQUIRE_OK(strata_runtime_describe(r, text.data(), length + 1, &length));
  CHECK_THAT(text, Catch::Contains("STRATA_BACKEND") && Catch::Contains("host") &&
                       Catch::Contains(dir.path()));

  REQUIRE_OK(strata_tensor_destroy(on_nvme));
  REQUIRE_OK(strata_tensor_destroy(on_cpu));
  REQUIRE_OK(strata_runtime_stats(r, &stats));
  CHECK(stats.tensors == 0);
  REQUIRE_OK(strata_stream_destroy(s));
  REQUIRE_OK(strata_runtime_destroy(r));
  rt.runtime = nullptr;
  CHECK(dir.entries() == 0);  // the swap file had no name
}

TEST_CASE("c_api: dtype, shape and name come back from strata_tensor_info", "[c_api]") {
  TestRuntime rt;
  strata_runtime_t* r = rt.runtime;
  const int64_t shape[] = {3, 5, 7};
  strata_tensor_t t{};
  REQUIRE_OK(strata_tensor_create_ex(r, "model.layers.0.attn.q_proj.weight", STRATA_DTYPE_BFLOAT16,
                                     shape, 3, STRATA_TIER_CPU, &t));
  strata_tensor_info_t info;
  REQUIRE_OK(strata_tensor_info(t, &info));
  CHECK(info.bytes == 3 * 5 * 7 * 2);
  CHECK(info.home == STRATA_TIER_CPU);
  CHECK(info.dtype == STRATA_DTYPE_BFLOAT16);
  CHECK(info.ndim == 3);
  CHECK(info.shape[0] == 3);
  CHECK(info.shape[1] == 5);
  CHECK(info.shape[2] == 7);
  CHECK(info.shape[3] == 0);

  strata_tensor_t scalar{};
  REQUIRE_OK(
      strata_tensor_create_ex(r, "step", STRATA_DTYPE_INT64, nullptr, 0, STRATA_TIER_GPU, &scalar));
  REQUIRE_OK(strata_tensor_info(scalar, &info));
  CHECK(info.bytes == 8);
  CHECK(info.ndim == 0);
  CHECK(info.home == STRATA_TIER_GPU);

  strata_tensor_t bytes{};
  REQUIRE_OK(strata_tensor_create(r, "raw", 1000, STRATA_TIER_CPU, &bytes));
  REQUIRE_OK(strata_tensor_info(bytes, &info));
  CHECK(info.dtype == STRATA_DTYPE_UINT8);
  CHECK(info.ndim == 1);
  CHECK(info.shape[0] == 1000);

  strata_tensor_t found{};
  REQUIRE_OK(strata_tensor_find(r, "model.layers.0.attn.q_proj.weight", &found));
  CHECK(std::memcmp(&found, &t, sizeof t) == 0);

  size_t length = 0;
  REQUIRE_OK(strata_tensor_name(t, nullptr, 0, &length));
  CHECK(length == std::strlen("model.layers.0.attn.q_proj.weight"));
  char small[6];
  REQUIRE_OK(strata_tensor_name(t, small, sizeof small, &length));
  CHECK(std::string(small) == "model");  // truncated, NUL-terminated
  std::string name(length + 1, '\0');
  REQUIRE_OK(strata_tensor_name(t, name.data(), name.size(), nullptr));
  CHECK(name.c_str() == std::string("model.layers.0.attn.q_proj.weight"));

  // A destroyed tensor's dtype does not leak into the next one in its slot.
  REQUIRE_OK(strata_tensor_destroy(t));
  REQUIRE_OK(strata_tensor_create(r, "again", 16, STRATA_TIER_CPU, &found));
  REQUIRE_OK(strata_tensor_info(found, &info));
  CHECK(info.dtype == STRATA_DTYPE_UINT8);
  CHECK(info.shape[0] == 16);
}

TEST_CASE("c_api: steps and a given access order drive the scheduler", "[c_api]") {
  TestRuntime rt;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  constexpr uint64_t kBytes = 192 * kKiB;  // 6 layers: more than the 1 MiB GPU arena holds
  std::vector<strata_tensor_t> layers(6);
  std::vector<strata_access_t> order;
  for (size_t i = 0; i < layers.size(); ++i) {
    REQUIRE_OK(strata_tensor_create(r, ("layer" + std::to_string(i)).c_str(), kBytes,
                                    STRATA_TIER_CPU, &layers[i]));
    write_through(layers[i], STRATA_TIER_CPU, s, kBytes, static_cast<uint32_t>(10 + i));
    order.push_back({layers[i], STRATA_TIER_GPU});
  }
  REQUIRE_OK(strata_runtime_set_access_order(r, order.data(), order.size()));
  for (int step = 0; step < 3; ++step) {
    REQUIRE_OK(strata_runtime_step_begin(r));
    for (size_t i = 0; i < layers.size(); ++i) {
      CHECK(read_through(layers[i], STRATA_TIER_GPU, s, kBytes, static_cast<uint32_t>(10 + i)));
    }
    REQUIRE_OK(strata_runtime_step_end(r));
  }
  strata_stats_t stats;
  REQUIRE_OK(strata_runtime_stats(r, &stats));
  CHECK(stats.schedule.has_trace == 1);
  CHECK(stats.schedule.given_order == 1);
  CHECK(stats.schedule.trace_length == layers.size());
  CHECK(stats.schedule.steps == 3);
  CHECK(stats.prefetches_issued > 0);
  CHECK(stats.tiers[STRATA_TIER_NVME].present == 0);
  REQUIRE_OK(strata_runtime_set_access_order(r, nullptr, 0));
}

// TensorStore::destroy once leaked a tensor's last valid GPU or CPU copy (drop_copy()'s rule-1
// guard kept it, then the record forgot the block).
TEST_CASE("c_api: destroying a written tensor frees its copies in every tier", "[c_api]") {
  strata::testing::TempDir dir("strata-c-api");
  TestRuntime rt(nvme_vars(dir.path()));
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(rt.runtime, &s));
  for (strata_tier_t home : {STRATA_TIER_NVME, STRATA_TIER_CPU}) {
    for (strata_tier_t tier : {STRATA_TIER_GPU, STRATA_TIER_CPU}) {
      strata_stats_t before;
      REQUIRE_OK(strata_runtime_stats(rt.runtime, &before));
      strata_tensor_t t{};
      REQUIRE_OK(strata_tensor_create(rt.runtime, "x", 64 * kKiB, home, &t));
      write_through(t, tier, s, 64 * kKiB, 5);
      REQUIRE_OK(strata_tensor_destroy(t));
      strata_stats_t after;
      REQUIRE_OK(strata_runtime_stats(rt.runtime, &after));
      INFO("home " << home << ", written in tier " << tier);
      CHECK(after.tiers[STRATA_TIER_GPU].used == before.tiers[STRATA_TIER_GPU].used);
      CHECK(after.tiers[STRATA_TIER_CPU].used == before.tiers[STRATA_TIER_CPU].used);
    }
  }
}

}  // namespace
}  // namespace strata::testing
