// Ranks sharing a GPU on a backend that allows it (Gloo): each rank's arena is a share of its GPU
// (Device::budget_sharing), and more ranks on a GPU than a share assumed fail every rank at
// start, naming them (comm/gpu_assignment.h). The verdict from the ranks' claims, and real jobs
// of two processes on the host backend that claim one simulated GPU
// (strata/testing/simulated_gpu.h).
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "comm/gpu_assignment.h"
#include "comm/rank_processes.h"
#include "strata/device/backend.h"
#include "strata/testing/simulated_gpu.h"

namespace strata {
namespace {

using comm_internal::GpuClaim;
using comm_internal::GpuIdentity;
using namespace std::chrono_literals;

GpuClaim claim(const std::string& host, const std::string& bus, int ordinal, int sharing) {
  GpuClaim c;
  c.gpu.machine = host + "/boot-1";
  c.gpu.host = host;
  c.gpu.bus_id = bus;
  c.gpu.ordinal = ordinal;
  c.sharing = sharing;
  return c;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

constexpr const char* kFix =
    ": together their arenas over-commit the GPU (STRATA_GPU_BYTES, 80% by default, is a "
    "percentage of each rank's share of its GPU). Give each rank its own GPU (a "
    "CUDA_VISIBLE_DEVICES set per rank, or LOCAL_RANK picking among the visible devices); or, "
    "to share one, set CUDA_VISIBLE_DEVICES or STRATA_DEVICE in the launcher's environment, not "
    "per rank, so that every rank divides the GPU (docs/configuration.md, \"Which device\"); or "
    "set STRATA_GPU_BYTES to a size that the arenas of all the ranks on a GPU fit together";

std::string verdict(const std::vector<GpuClaim>& claims) {
  const absl::Status s = comm_internal::check_gpu_budgets(claims);
  if (s.ok()) return "ok";
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  return std::string(s.message());
}

TEST_CASE("GPU sharing: more ranks on a GPU than their arenas assumed is named",
          "[comm][gpu-sharing]") {
  const std::string gpu0 = "0000:3b:00.0";
  CHECK(verdict({}) == "ok");
  // Two ranks on one GPU, each sized for two: fine. Sized for one: over-committed.
  CHECK(verdict({claim("node7", gpu0, 0, 2), claim("node7", gpu0, 0, 2)}) == "ok");
  CHECK(verdict({claim("node7", gpu0, 0, 1), claim("node7", gpu0, 0, 1)}) ==
        std::string("ranks 0 and 1 share GPU 0 (PCI 0000:3b:00.0) on host node7 but the GPU "
                    "arenas of ranks 0 and 1 were sized for 1 rank on it") +
            kFix);
  // Three on a GPU sized for two: over by one; sized for three (or more): fine.
  CHECK(verdict({claim("node7", gpu0, 0, 3), claim("node7", gpu0, 0, 3),
                 claim("node7", gpu0, 0, 3)}) == "ok");
  CHECK(verdict({claim("node7", gpu0, 0, 4), claim("node7", gpu0, 0, 4),
                 claim("node7", gpu0, 0, 3)}) == "ok");
  CHECK(verdict(
            {claim("node7", gpu0, 0, 3), claim("node7", gpu0, 0, 2), claim("node7", gpu0, 0, 1)}) ==
        std::string("ranks 0, 1 and 2 share GPU 0 (PCI 0000:3b:00.0) on host node7 but the GPU "
                    "arena of rank 2 was sized for 1 rank on it, of rank 1 for 2 ranks") +
            kFix);
  // One short rank is enough; a rank whose arena is not a share (0) assumes nothing.
  CHECK(verdict({claim("node7", gpu0, 0, 0), claim("node7", gpu0, 0, 2)}) == "ok");
  CHECK(verdict({claim("node7", gpu0, 0, 0), claim("node7", gpu0, 0, 0)}) == "ok");
  CHECK(contains(verdict({claim("node7", gpu0, 0, 0), claim("node7", gpu0, 0, 1)}),
                 "ranks 0 and 1 share GPU 0 (PCI 0000:3b:00.0) on host node7 but the GPU arena "
                 "of rank 1 was sized for 1 rank on it:"));
  // The same bus id on another machine is another GPU; no GPU (host ranks) is never shared.
  CHECK(verdict({claim("node7", gpu0, 0, 1), claim("node8", gpu0, 0, 1)}) == "ok");
  CHECK(verdict({claim("node7", "", -1, 1), claim("node7", "", -1, 1)}) == "ok");
  // Two machines, each with a pair sized for one; the ordinal named is the first rank's.
  CHECK(verdict({claim("node8", gpu0, 1, 1), claim("node7", gpu0, 0, 1), claim("node8", gpu0, 3, 1),
                 claim("node7", gpu0, 0, 1)}) ==
        std::string("ranks 0 and 2 share GPU 1 (PCI 0000:3b:00.0) on host node8 but the GPU "
                    "arenas of ranks 0 and 2 were sized for 1 rank on it; ranks 1 and 3 share "
                    "GPU 0 (PCI 0000:3b:00.0) on host node7 but the GPU arenas of ranks 1 and 3 "
                    "were sized for 1 rank on it") +
            kFix);
}

TEST_CASE("GPU sharing: a claim travels as text, garbage names the build", "[comm][gpu-sharing]") {
  const GpuClaim mine = claim("node7", "0000:3b:00.0", 3, 2);
  const absl::StatusOr<GpuClaim> back = GpuClaim::decode(mine.encode());
  REQUIRE(back.ok());
  CHECK(back->sharing == 2);
  CHECK(back->gpu.encode() == mine.gpu.encode());
  for (const char* bad : {"", "2", "x\tm\th\tb\t0", "-1\tm\th\tb\t0", "2\tm\th\tb"}) {
    INFO(bad);
    const absl::StatusOr<GpuClaim> decoded = GpuClaim::decode(bad);
    REQUIRE_FALSE(decoded.ok());
    CHECK(contains(std::string(decoded.status().message()), "is every rank the same strata build"));
  }
}

TEST_CASE("GPU sharing: a rank claims its device's GPU and budget, or the simulated one",
          "[comm][gpu-sharing]") {
  CHECK(GpuClaim::of(nullptr).gpu.bus_id.empty());
  CHECK(GpuClaim::of(nullptr).sharing == 0);
  auto device = make_device(Backend::kHost, 0);
  REQUIRE(device.ok());
  (*device)->set_budget_sharing(2);
  GpuClaim host = GpuClaim::of(device->get());
  CHECK(host.gpu.bus_id.empty());  // host memory: never shared
  CHECK(host.sharing == 2);
  CHECK_FALSE(host.gpu.machine.empty());

  testing::simulate_gpu_for_testing(
      testing::SimulatedGpu{.pci_bus_id = "0000:99:00.0", .ordinal = 5});
  const GpuClaim simulated = GpuClaim::of(device->get());
  testing::simulate_gpu_for_testing(std::nullopt);
  CHECK(simulated.gpu.bus_id == "0000:99:00.0");
  CHECK(simulated.gpu.ordinal == 5);
  CHECK(simulated.gpu.machine == host.gpu.machine);
  CHECK(simulated.sharing == 2);
  CHECK(GpuClaim::of(device->get()).gpu.bus_id.empty());  // the simulation ended
}

// Two ranks (processes) on the host backend claiming one simulated GPU, their arenas sized for
// `sharing` ranks each.
std::vector<testing::RankOutcome> shared_gpu_job(int sharing, const std::string& backend) {
  testing::RankProcesses job({STRATA_COMM_FAULT_RANK, "shared-gpu", std::to_string(sharing)}, 2,
                             {0, 1}, testing::free_port(),
                             {{"STRATA_COMM_TIMEOUT", "20s"}, {"STRATA_COMM_BACKEND", backend}});
  return job.wait(60s);
}

TEST_CASE("GPU sharing: two ranks on one GPU, each sized for one, fail at start naming it",
          "[comm][gpu-sharing][failure]") {
  for (const char* backend : {"gloo", "auto"}) {
    const std::vector<testing::RankOutcome> outcomes = shared_gpu_job(1, backend);
    REQUIRE(outcomes.size() == 2);
    for (const testing::RankOutcome& r : outcomes) {
      INFO("STRATA_COMM_BACKEND=" << backend << ", rank " << r.rank << ": " << r.output);
      CHECK_FALSE(r.killed_by_test);
      CHECK(r.exited);
      CHECK(r.status == 1);
      // The same one error on every rank.
      CHECK(contains(r.output, std::string("error: ranks 0 and 1 share GPU 0 (PCI 0000:3b:00.0) "
                                           "on host ")));
      CHECK(contains(r.output, std::string(" but the GPU arenas of ranks 0 and 1 were sized for 1 "
                                           "rank on it") +
                                   kFix + "\n"));
    }
  }
}

TEST_CASE("GPU sharing: two ranks on one GPU, each sized for two, start", "[comm][gpu-sharing]") {
  for (const testing::RankOutcome& r : shared_gpu_job(2, "auto")) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "rank " + std::to_string(r.rank) + ": ok"));
  }
}

}  // namespace
}  // namespace strata
