// A learning-rate schedule on the ZeRO engine: set_group() between steps is what the next step
// uses (stages 1-3, against AdamW computed in double), the overlapped step keeps its early work
// under a rate that changes every step and stays exact when the rate changes mid-backward, and
// misuse is a precise error.
#include <absl/strings/match.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "strata/zero/zero_engine.h"
#include "zero/zero_rig.h"

namespace strata {
namespace {

// A job of one rank: the process alone, no launch variables.
Communicator& lone() {
  static std::unique_ptr<Communicator> comm = [] {
    auto created = Communicator::from_environment();
    if (!created.ok()) FAIL(created.status().ToString());
    return *std::move(created);
  }();
  return *comm;
}

// fp32 parameters and gradients, no clipping: the masters follow AdamW's formula alone.
ZeroOptions schedule_options(uint32_t stage) {
  ZeroOptions o;
  o.stage = stage;
  o.param_type = ParamType::kF32;
  o.grad_type = GradType::kF32;
  o.bucket_bytes = 8 << 10;
  o.alignment = 8;
  o.groups = {AdamGroup{.lr = 1e-2F, .weight_decay = 0.1F}, AdamGroup{.lr = 3e-3F}};
  o.persist_below_bytes = 256;  // stage 3: the norms and the bias stay whole
  return o;
}

// torch.optim.AdamW's step in double, one element: lrs[k] is step k's rate (1-based steps).
double adamw(double p, const std::vector<double>& lrs, const AdamGroup& g, uint32_t param,
             uint64_t i) {
  double m = 0;
  double v = 0;
  for (size_t k = 0; k < lrs.size(); ++k) {
    const double grad = testing::synthetic_grad(k, 0, 0, param, i);
    p *= 1.0 - lrs[k] * g.weight_decay;
    m = g.beta1 * m + (1.0 - g.beta1) * grad;
    v = g.beta2 * v + (1.0 - g.beta2) * grad * grad;
    const double bc1 = 1.0 - std::pow(static_cast<double>(g.beta1), static_cast<double>(k + 1));
    const double bc2 = 1.0 - std::pow(static_cast<double>(g.beta2), static_cast<double>(k + 1));
    p -= lrs[k] / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + g.eps);
  }
  return p;
}

TEST_CASE("ZeroEngine::set_group: the steps after it use the new rate (AdamW in double)",
          "[zero][schedule]") {
  const uint32_t stage = GENERATE(1U, 2U, 3U);
  INFO("stage " << stage);
  const auto model = testing::zero_model();
  const ZeroOptions o = schedule_options(stage);
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  auto engine = ZeroEngine::create(**runtime, lone(), model.params, o);
  REQUIRE(engine.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  // Group 0 warms up (1e-2 at creation, then 2.5e-3 and 5e-3); group 1 keeps its 3e-3.
  const std::vector<float> warm = {1e-2F, 2.5e-3F, 5e-3F};
  for (uint64_t step = 0; step < warm.size(); ++step) {
    if (step > 0) {
      AdamGroup g = o.groups[0];
      g.lr = warm[step];
      REQUIRE((*engine)->set_group(0, g).ok());
    }
    auto now = (*engine)->group(0);
    REQUIRE(now.ok());
    CHECK(now->lr == warm[step]);
    CHECK(now->weight_decay == o.groups[0].weight_decay);
    REQUIRE(
        testing::zero_micro_step(**engine, **stream, model, o.grad_type, step, 0, 0, false).ok());
    REQUIRE((*engine)->step().ok());
  }
  CHECK((*engine)->group(1)->lr == o.groups[1].lr);
  double worst = 0;
  double moved = 0;  // how far the constant rate would have been: the schedule mattered
  for (uint32_t p = 0; p < model.params.size(); ++p) {
    const uint32_t group = model.params[p].group;
    const AdamGroup& g = o.groups[group];
    std::vector<double> lrs(warm.begin(), warm.end());
    if (group == 1) lrs.assign(warm.size(), g.lr);
    const std::vector<double> constant(warm.size(), g.lr);
    const auto& initial = model.initial[p];
    std::vector<float> master(initial.size());
    REQUIRE((*engine)->read_state(ZeroParamId{p}, master, {}, {}).ok());
    for (uint64_t i = 0; i < initial.size(); ++i) {
      const double want = adamw(initial[i], lrs, g, p, i);
      worst = std::max(worst, std::abs(master[i] - want));
      moved = std::max(moved, std::abs(adamw(initial[i], constant, g, p, i) - want));
    }
  }
  INFO("largest difference from AdamW in double " << worst << ", from the constant rate " << moved);
  CHECK(worst < 2e-6);  // fp32 rounding of values below 2 over three steps
  CHECK(moved > 5e-3);
}

TEST_CASE(
    "The overlapped step keeps its early work under a rate changed every step, and a change "
    "during backward stays exact",
    "[zero][schedule][overlap]") {
  const uint32_t stage = GENERATE(1U, 3U);
  INFO("stage " << stage);
  const auto model = testing::zero_model();
  const ZeroOptions plain_options = schedule_options(stage);
  ZeroOptions overlap_options = plain_options;
  overlap_options.optimizer.overlap.enabled = true;
  auto plain_runtime = testing::zero_runtime("");
  auto overlap_runtime = testing::zero_runtime("");
  REQUIRE(plain_runtime.ok());
  REQUIRE(overlap_runtime.ok());
  auto plain = ZeroEngine::create(**plain_runtime, lone(), model.params, plain_options);
  auto overlap = ZeroEngine::create(**overlap_runtime, lone(), model.params, overlap_options);
  REQUIRE(plain.ok());
  REQUIRE(overlap.ok());
  auto plain_stream = (*plain_runtime)->device().create_stream();
  auto overlap_stream = (*overlap_runtime)->device().create_stream();
  REQUIRE(plain_stream.ok());
  REQUIRE(overlap_stream.ok());
  const int steps = 5;
  const int late = 3;  // this step's rate changes after backward, once early work has run
  for (int step = 0; step < steps; ++step) {
    AdamGroup g = plain_options.groups[0];
    g.lr = 1e-2F * static_cast<float>(step + 1) / steps;  // a warm-up
    if (step != late) {
      REQUIRE((*plain)->set_group(0, g).ok());
      REQUIRE((*overlap)->set_group(0, g).ok());
    }
    REQUIRE(testing::zero_micro_step(**plain, **plain_stream, model, plain_options.grad_type, step,
                                     0, 0, false)
                .ok());
    REQUIRE(testing::zero_micro_step(**overlap, **overlap_stream, model, overlap_options.grad_type,
                                     step, 0, 0, false)
                .ok());
    (*overlap)->wait_for_gradients();
    (*overlap)->optimizer().wait_for_early_steps();
    if (step == late) {
      REQUIRE((*plain)->set_group(0, g).ok());
      REQUIRE((*overlap)->set_group(0, g).ok());
    }
    auto want = (*plain)->step();
    auto got = (*overlap)->step();
    REQUIRE(want.ok());
    REQUIRE(got.ok());
    CHECK(got->grad_norm == want->grad_norm);
    if (step == late) {
      CHECK(got->rolled_back);  // the early work used the old rate: redone
      CHECK(got->early_elements == 0);
    } else {
      CHECK_FALSE(got->rolled_back);  // the armed plan took the new rate
      CHECK(got->early_elements > 0);
    }
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      auto a = testing::zero_param(**overlap, **overlap_stream, p);
      auto b = testing::zero_param(**plain, **plain_stream, p);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(*a == *b);
    }
  }
  CHECK((*overlap)->optimizer().stats().overlap_rollbacks == 1);
}

TEST_CASE("ZeroEngine::set_group refuses a group it lacks and a bad value, naming them",
          "[zero][schedule]") {
  const auto model = testing::zero_model();
  const ZeroOptions o = schedule_options(2);
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  auto engine = ZeroEngine::create(**runtime, lone(), model.params, o);
  REQUIRE(engine.ok());
  auto missing = (*engine)->set_group(2, AdamGroup{});
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(missing.message(), "no hyper-parameter group 2; the engine has 2"));
  CHECK((*engine)->group(2).status().code() == absl::StatusCode::kNotFound);
  auto bad = (*engine)->set_group(0, AdamGroup{.lr = -1.0F});
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(bad.message(), "ZeroEngine::set_group(0)"));
  CHECK(absl::StrContains(bad.message(), "lr"));
  CHECK((*engine)->group(0)->lr == o.groups[0].lr);  // unchanged
}

}  // namespace
}  // namespace strata
