// STRATA_COMM_BACKEND=auto agreed by every rank (comm/backend_agreement.h): the verdict from the
// ranks' capabilities, and a real job over loopback where one rank claims a GPU and NCCL
// (STRATA_TESTING_CLAIM_NCCL) while the others have neither: every rank fails with the same
// named error, within a bound, and no process is left behind.
#include "comm/backend_agreement.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "comm/rank_processes.h"
#include "strata/comm/nccl_library.h"

namespace strata {
namespace {

using comm_internal::choose_backend;
using comm_internal::CommCapability;
using namespace std::chrono_literals;

constexpr CommCapability kNoGpu{.cuda_device = false, .nccl = false};
constexpr CommCapability kNoNccl{.cuda_device = true, .nccl = false};
constexpr CommCapability kNccl{.cuda_device = true, .nccl = true};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("auto: unanimous ranks get their backend, mixed ones a named error", "[comm][auto]") {
  CHECK(*choose_backend({kNccl}) == CommBackendKind::kNccl);
  CHECK(*choose_backend({kNccl, kNccl, kNccl}) == CommBackendKind::kNccl);
  CHECK(*choose_backend({kNoGpu, kNoGpu}) == CommBackendKind::kGloo);
  CHECK(*choose_backend({kNoNccl, kNoGpu}) == CommBackendKind::kGloo);

  absl::StatusOr<CommBackendKind> mixed = choose_backend({kNccl, kNoNccl, kNccl, kNoGpu, kNoNccl});
  REQUIRE_FALSE(mixed.ok());
  const std::string m(mixed.status().message());
  INFO(m);
  CHECK(mixed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(m, "ranks 0 and 2 can use NCCL"));
  CHECK(contains(m, "ranks 1 and 4 found no NCCL"));
  CHECK(contains(m, "rank 3 has no GPU"));
  CHECK(contains(m, "set STRATA_COMM_BACKEND=gloo on every rank"));
  CHECK(contains(m, "pip install " + std::string(nccl_wheel()) + ","));
}

TEST_CASE("auto: Gloo on a CUDA device is warned about, naming why NCCL was not used",
          "[comm][auto]") {
  using comm_internal::gloo_on_cuda_warning;
  constexpr auto kGloo = CommBackendKind::kGloo;
  const std::string note = "not built: CUDA 13.0 was found but NCCL's header nccl.h was not";
  // Nothing to say: NCCL chosen, or no CUDA device.
  CHECK(gloo_on_cuda_warning(CommBackendKind::kNccl, true, true, note, "").empty());
  CHECK(gloo_on_cuda_warning(kGloo, false, false, note, "").empty());
  CHECK(gloo_on_cuda_warning(kGloo, false, true, note, "NCCL was not found").empty());
  // This build has no NCCL backend: the build's reason.
  const std::string not_built = gloo_on_cuda_warning(kGloo, true, false, note, "");
  INFO(not_built);
  CHECK(contains(not_built, "STRATA_COMM_BACKEND=auto: using Gloo on a CUDA device"));
  CHECK(contains(not_built, "this build of strata has no NCCL backend (" + note + ")"));
  CHECK(contains(not_built, "STRATA_COMM_BACKEND=gloo chooses this without a warning"));
  // Built, but the library was not found: the search's error.
  const std::string not_found =
      gloo_on_cuda_warning(kGloo, true, true, note, "NCCL (libnccl.so.2) was not found.");
  INFO(not_found);
  CHECK(contains(not_found, "using Gloo on a CUDA device"));
  CHECK(contains(not_found, "NCCL (libnccl.so.2) was not found."));
  CHECK_FALSE(contains(not_found, note));
}

TEST_CASE("auto: a capability survives the rendezvous, and garbage is named", "[comm][auto]") {
  for (const CommCapability& c : {kNoGpu, kNoNccl, kNccl}) {
    absl::StatusOr<CommCapability> back = CommCapability::decode(c.encode());
    REQUIRE(back.ok());
    CHECK(back->cuda_device == c.cuda_device);
    CHECK(back->nccl == c.nccl);
  }
  CHECK_FALSE(CommCapability::decode("gpu=1;nccl=2").ok());
  CHECK_FALSE(CommCapability::decode("").ok());
}

TEST_CASE("auto: one rank with NCCL among ranks without: every rank fails naming them",
          "[comm][auto][failure]") {
  // Rank 1 claims a GPU and NCCL; ranks 0 and 2 have a host device (no GPU).
  testing::RankProcesses job({STRATA_COMM_FAULT_RANK, "claim-nccl", "1"}, 3, {0, 1, 2},
                             testing::free_port(),
                             {{"STRATA_COMM_TIMEOUT", "20s"}, {"STRATA_COMM_BACKEND", "auto"}});
  for (const testing::RankOutcome& r : job.wait(60s)) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "STRATA_COMM_BACKEND=auto: the ranks cannot agree"));
    CHECK(contains(r.output, "rank 1 can use NCCL"));
    CHECK(contains(r.output, "ranks 0 and 2 have no GPU"));
    CHECK(contains(r.output, "set STRATA_COMM_BACKEND=gloo on every rank"));
  }
}

TEST_CASE("auto: ranks without a GPU agree on Gloo", "[comm][auto]") {
  testing::RankProcesses job({STRATA_COMM_FAULT_RANK, "ok", "-1"}, 2, {0, 1}, testing::free_port(),
                             {{"STRATA_COMM_TIMEOUT", "20s"}, {"STRATA_COMM_BACKEND", "auto"}});
  for (const testing::RankOutcome& r : job.wait(60s)) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK(r.exited);
    CHECK(r.status == 0);
  }
}

}  // namespace
}  // namespace strata
