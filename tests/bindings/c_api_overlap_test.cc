// The C API's overlapped optimizer step: options.overlap, strata_optimizer_grad_ready_hint,
// strata_optimizer_set_final_micro_step, strata_optimizer_wait_for_early_steps and the overlap
// fields of the step result and the statistics. Two optimizers take the same gradients, one
// with overlap: their states are bitwise equal after every step, clipping or not.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "c_api_fixtures.h"
#include "strata/strata.h"
#include "temp_dir.h"

namespace strata::testing {
namespace {

constexpr uint64_t kCount = 3000;

struct Model {
  strata_optimizer_t* opt = nullptr;
  strata_tensor_t params[2]{};
  strata_tensor_t grads[2]{};
  strata_param_t ids[2]{};
};

Model make_model(strata_runtime_t* r, const std::string& prefix, bool overlap, strata_tier_t home) {
  strata_optimizer_options_t options;
  REQUIRE_OK(strata_optimizer_options_init(&options));
  options.state_home = home;
  options.defaults.lr = 1e-2F;
  options.max_grad_norm = 40.0F;    // bites at the steps with the larger gradients (below)
  options.chunk_elements = kCount;  // NVMe: one chunk per parameter
  options.isa = STRATA_CPU_ISA_SCALAR;
  options.overlap.enabled = overlap ? 1 : 0;
  Model m;
  REQUIRE_OK(strata_optimizer_create(r, &options, &m.opt));
  std::vector<float> initial(kCount);
  for (uint64_t i = 0; i < kCount; ++i) initial[i] = 0.5F * std::sin(static_cast<float>(i));
  for (int k = 0; k < 2; ++k) {
    const std::string name = prefix + std::to_string(k);
    REQUIRE_OK(strata_tensor_create(r, name.c_str(), kCount * 4, STRATA_TIER_CPU, &m.params[k]));
    REQUIRE_OK(strata_tensor_create(r, (name + ".grad").c_str(), kCount * 4, STRATA_TIER_CPU,
                                    &m.grads[k]));
    strata_param_spec_t spec{};
    spec.name = name.c_str();
    spec.param = m.params[k];
    spec.grad = m.grads[k];
    spec.param_type = STRATA_PARAM_F32;
    spec.grad_type = STRATA_GRAD_F32;
    spec.count = kCount;
    spec.initial_master = initial.data();
    REQUIRE_OK(strata_optimizer_add_param(m.opt, &spec, &m.ids[k]));
  }
  return m;
}

void write_grad(strata_tensor_t grad, strata_stream_t* s, int step, int micro, int k) {
  // Summed over the two micro-steps: a norm of about 96 on even steps (clipped to 40), 24 on
  // odd ones (not clipped).
  const float scale = step % 2 == 0 ? 1.0F : 0.25F;
  void* p = nullptr;
  REQUIRE_OK(strata_tensor_acquire(grad, STRATA_TIER_GPU, s, STRATA_ACCESS_WRITE, &p));
  REQUIRE_OK(strata_stream_synchronize(s));  // host backend: "GPU" memory is host memory
  auto* g = static_cast<float*>(p);
  for (uint64_t i = 0; i < kCount; ++i) {
    g[i] =
        scale * std::cos(0.37F * static_cast<float>(i) + static_cast<float>(3 * step + micro + k));
  }
  REQUIRE_OK(strata_tensor_release(grad, s));
}

std::vector<float> state_of(const Model& m, int k) {
  std::vector<float> all(3 * kCount);
  REQUIRE_OK(strata_optimizer_read_state(m.opt, m.ids[k], all.data(), all.data() + kCount,
                                         all.data() + 2 * kCount, kCount));
  return all;
}

TEST_CASE("c_api: the overlapped step is bitwise the plain one", "[c_api][optimizer][overlap]") {
  const strata_tier_t home =
      GENERATE(strata_tier_t{STRATA_TIER_CPU}, strata_tier_t{STRATA_TIER_NVME});
  INFO("states in tier " << home);
  TempDir swap("strata-c-api-overlap");
  Vars vars = nvme_vars(swap.path());
  vars.emplace_back("STRATA_CPU_BYTES", "8MiB");
  TestRuntime rt(vars);
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));

  strata_optimizer_options_t defaults;
  REQUIRE_OK(strata_optimizer_options_init(&defaults));
  CHECK(defaults.overlap.enabled == 0);
  CHECK(defaults.overlap.max_host_bytes == 0);

  Model plain = make_model(r, "plain", false, home);
  Model over = make_model(r, "over", true, home);
  expect_error(strata_optimizer_grad_ready_hint(over.opt, over.ids[0], s, 7),
               STRATA_INVALID_ARGUMENT, "strata_optimizer_grad_ready_hint: completion is 7");
  expect_error(strata_optimizer_set_final_micro_step(nullptr, 1), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_set_final_micro_step: optimizer is NULL");
  expect_error(strata_optimizer_wait_for_early_steps(nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_wait_for_early_steps: optimizer is NULL");

  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    // Two micro-steps. The overlapped optimizer is told which landings are partial: parameter
    // 0 by its hint, parameter 1 through set_final_micro_step and the DEFAULT hint.
    for (int micro = 0; micro < 2; ++micro) {
      const bool last = micro == 1;
      REQUIRE_OK(strata_optimizer_set_final_micro_step(over.opt, last ? 1 : 0));
      for (int k = 0; k < 2; ++k) {
        write_grad(plain.grads[k], s, step, micro, k);
        REQUIRE_OK(strata_optimizer_grad_ready(plain.opt, plain.ids[k], s));
        write_grad(over.grads[k], s, step, micro, k);
        const strata_grad_completion_t hint =
            k == 1 ? STRATA_GRAD_COMPLETION_DEFAULT
                   : (last ? STRATA_GRAD_COMPLETION_FINAL : STRATA_GRAD_COMPLETION_MORE);
        REQUIRE_OK(strata_optimizer_grad_ready_hint(over.opt, over.ids[k], s, hint));
      }
      // Parameter 0's early step has run by now (parameter 1's, landed last, may not have).
      REQUIRE_OK(strata_optimizer_wait_for_early_steps(over.opt));
    }
    strata_step_result_t a{};
    strata_step_result_t b{};
    REQUIRE_OK(strata_optimizer_step(plain.opt, &a));
    REQUIRE_OK(strata_optimizer_step(over.opt, &b));
    CHECK(a.grad_norm == b.grad_norm);
    CHECK(a.clip_coef == b.clip_coef);
    CHECK(a.early_elements == 0);
    CHECK(a.rolled_back == 0);
    if (step % 2 == 0) {  // clipped: the early work is rolled back and redone
      CHECK(b.clip_coef < 1.0);
      CHECK(b.rolled_back == 1);
      CHECK(b.early_elements == 0);
    } else {
      CHECK(b.clip_coef == 1.0);
      CHECK(b.rolled_back == 0);
      CHECK(b.early_elements >= kCount);
    }
    for (int k = 0; k < 2; ++k) CHECK(state_of(plain, k) == state_of(over, k));
  }
  strata_optimizer_stats_t stats;
  REQUIRE_OK(strata_optimizer_stats(over.opt, &stats));
  CHECK(stats.overlap_early_steps == 2);
  CHECK(stats.overlap_rollbacks == 2);
  CHECK(stats.last_early_elements >= kCount);
  CHECK(stats.overlap_host_bytes > 0);
  CHECK(stats.overlap_budget_misses == 0);
  REQUIRE_OK(strata_optimizer_stats(plain.opt, &stats));
  CHECK(stats.overlap_early_steps == 0);
  CHECK(stats.overlap_rollbacks == 0);
  CHECK(stats.overlap_host_bytes == 0);
  for (Model* m : {&plain, &over}) REQUIRE_OK(strata_optimizer_destroy(m->opt));
}

}  // namespace
}  // namespace strata::testing
