// hpZ's switches, in one process: STRATA_ZERO_HPZ and LOCAL_WORLD_SIZE read into
// ZeroOptions::hpz_node_ranks, and the options the engine refuses or ignores (the multi-rank
// behaviour is zero3_ranks_test.cc's).
#include <absl/strings/match.h>
#include <stdlib.h>

#include <catch2/catch.hpp>

#include "strata/zero/zero_engine.h"
#include "zero/zero_rig.h"

namespace strata {
namespace {

// Sets (or, with nullptr, unsets) variables for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* hpz, const char* local) {
    set("STRATA_ZERO_HPZ", hpz);
    set("LOCAL_WORLD_SIZE", local);
  }
  ~ScopedEnv() {
    unsetenv("STRATA_ZERO_HPZ");
    unsetenv("LOCAL_WORLD_SIZE");
  }

 private:
  static void set(const char* name, const char* value) {
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
};

TEST_CASE("STRATA_ZERO_HPZ takes the node size from LOCAL_WORLD_SIZE", "[zero][hpz]") {
  {
    ScopedEnv env(nullptr, "4");
    CHECK(hpz_node_ranks_from_environment().value() == 0);
  }
  {
    ScopedEnv env("0", "4");
    CHECK(hpz_node_ranks_from_environment().value() == 0);
  }
  {
    ScopedEnv env("1", "4");
    CHECK(hpz_node_ranks_from_environment().value() == 4);
  }
  {
    ScopedEnv env("on", "2");
    CHECK(hpz_node_ranks_from_environment().value() == 2);
  }
  {
    ScopedEnv env("1", nullptr);
    auto got = hpz_node_ranks_from_environment();
    REQUIRE_FALSE(got.ok());
    CHECK(absl::StrContains(got.status().message(), "STRATA_ZERO_HPZ=1 needs LOCAL_WORLD_SIZE"));
  }
  {
    ScopedEnv env("maybe", "2");
    auto got = hpz_node_ranks_from_environment();
    REQUIRE_FALSE(got.ok());
    CHECK(absl::StrContains(got.status().message(), "STRATA_ZERO_HPZ='maybe' is not a switch"));
  }
}

TEST_CASE(
    "hpZ: a node size that does not divide the ranks is refused, one node or stage 2 "
    "leaves it off",
    "[zero][hpz]") {
  auto comm = Communicator::from_environment();  // a job of one rank
  REQUIRE(comm.ok());
  const auto model = testing::zero_model();
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  ZeroOptions o;
  o.stage = 3;
  o.bucket_bytes = 8 << 10;
  o.alignment = 8;
  o.persist_below_bytes = 128;
  o.groups = {AdamGroup{}, AdamGroup{.lr = 3e-3F}};
  o.hpz_node_ranks = 2;
  auto refused = ZeroEngine::create(**runtime, **comm, model.params, o);
  INFO(refused.status().ToString());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(refused.status().message(),
                          "hpz_node_ranks = 2 does not divide the job's 1 ranks"));
  o.hpz_node_ranks = 1;  // one node of one rank: nothing crosses nodes
  auto one_node = ZeroEngine::create(**runtime, **comm, model.params, o);
  INFO(one_node.status().ToString());
  REQUIRE(one_node.ok());
  CHECK((*one_node)->node_communicator() == nullptr);
  one_node->reset();
  o.stage = 2;
  o.hpz_node_ranks = 2;  // ignored, with a warning
  auto stage2 = ZeroEngine::create(**runtime, **comm, model.params, o);
  REQUIRE(stage2.ok());
  CHECK((*stage2)->node_communicator() == nullptr);
}

}  // namespace
}  // namespace strata
