// The C API's offload optimizer: calls with bad arguments return an error code and a message;
// steps match torch.optim.AdamW; checkpoints, zero_grad, groups and the loss scale.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "c_api_fixtures.h"
#include "strata/strata.h"
#include "temp_dir.h"

namespace strata::testing {
namespace {

// ---- The offload optimizer ----------------------------------------------------------------------

TEST_CASE("c_api: optimizer calls with bad arguments return an error code and a message",
          "[c_api][optimizer]") {
  TestRuntime rt;
  TestRuntime other;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  strata_stream_t* foreign_stream = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  REQUIRE_OK(strata_stream_create(other.runtime, &foreign_stream));
  strata_tensor_t param{};
  strata_tensor_t grad{};
  strata_tensor_t foreign{};
  REQUIRE_OK(strata_tensor_create(r, "w", 64 * 4, STRATA_TIER_CPU, &param));
  REQUIRE_OK(strata_tensor_create(r, "w.grad", 64 * 4, STRATA_TIER_CPU, &grad));
  REQUIRE_OK(strata_tensor_create(other.runtime, "g", 64 * 4, STRATA_TIER_CPU, &foreign));

  strata_optimizer_t* opt = nullptr;
  strata_optimizer_options_t options;
  expect_error(strata_optimizer_options_init(nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_options_init: options is NULL");
  expect_error(strata_adam_group_init(nullptr), STRATA_INVALID_ARGUMENT,
               "strata_adam_group_init: group is NULL");
  REQUIRE_OK(strata_optimizer_options_init(&options));
  CHECK(options.state_home == STRATA_TIER_CPU);
  CHECK(options.defaults.lr == Approx(1e-3));
  CHECK(options.defaults.beta2 == Approx(0.999));
  CHECK(options.defaults.weight_decay ==
        0.0F);  // AdamHyper's defaults (include/strata/optimizer/cpu_adam.h)
  CHECK(options.defaults.decoupled == 1);
  CHECK(options.loss_scaling.scale == 1.0F);
  expect_error(strata_optimizer_create(nullptr, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: runtime is NULL");
  expect_error(strata_optimizer_create(r, &options, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: out is NULL");
  options.state_home = STRATA_TIER_NVME;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_FAILED_PRECONDITION,
               "strata_optimizer_create: OffloadOptimizer: optimizer states on NVMe need an NVMe "
               "tier; set STRATA_NVME_PATHS");
  options.state_home = STRATA_TIER_GPU;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: OffloadOptimizer: state_home must be the cpu or the nvme");
  options.state_home = 7;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: options->state_home is 7");
  options.state_home = STRATA_TIER_CPU;
  options.isa = 9;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: options->isa is 9");
  options.isa = STRATA_CPU_ISA_AUTO;
  options.defaults.beta1 = 1.5F;
  expect_error(strata_optimizer_create(r, &options, &opt), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_create: OffloadOptimizer: beta1 1.5 must be in [0, 1)");
  CHECK(opt == nullptr);
  REQUIRE_OK(strata_optimizer_create(r, nullptr, &opt));  // the defaults

  strata_param_spec_t spec{};
  spec.name = "w";
  spec.param = param;
  spec.grad = grad;
  spec.param_type = STRATA_PARAM_F32;
  spec.grad_type = STRATA_GRAD_F32;
  spec.count = 64;
  strata_param_t id{};
  expect_error(strata_optimizer_add_param(opt, nullptr, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec is NULL");
  expect_error(strata_optimizer_add_param(opt, &spec, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: out is NULL");
  strata_param_spec_t bad = spec;
  bad.name = nullptr;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->name is NULL");
  bad = spec;
  bad.param = strata_tensor_t{};
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->param is a null handle");
  bad = spec;
  bad.grad = foreign;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->grad belongs to another runtime than the "
               "optimizer");
  bad = spec;
  bad.param_type = 5;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->param_type is 5");
  bad = spec;
  bad.grad_type = -2;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: spec->grad_type is -2");
  bad = spec;
  bad.count = 0;
  expect_error(strata_optimizer_add_param(opt, &bad, &id), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_param: OffloadOptimizer: parameter 'w' has count 0");
  REQUIRE_OK(strata_optimizer_add_param(opt, &spec, &id));
  strata_param_t again{};
  expect_error(strata_optimizer_add_param(opt, &spec, &again), STRATA_ALREADY_EXISTS,
               "strata_optimizer_add_param: ");
  CHECK(again.index == UINT32_MAX);  // outputs are cleared on failure

  strata_param_t missing{7};
  uint64_t steps = 0;
  expect_error(strata_optimizer_param_step_count(opt, missing, &steps), STRATA_NOT_FOUND,
               "strata_optimizer_param_step_count: param 7 is not a parameter of this optimizer");
  expect_error(strata_optimizer_find_param(opt, "nope", &missing), STRATA_NOT_FOUND,
               "strata_optimizer_find_param: ");
  expect_error(strata_optimizer_find_param(opt, nullptr, &missing), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_find_param: name is NULL");
  expect_error(strata_optimizer_grad_ready(opt, strata_param_t{7}, s), STRATA_NOT_FOUND,
               "strata_optimizer_grad_ready: ");
  expect_error(strata_optimizer_grad_ready(opt, id, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_grad_ready: stream is NULL");
  expect_error(strata_optimizer_grad_ready(opt, id, foreign_stream), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_grad_ready: stream belongs to another runtime than optimizer");
  expect_error(strata_optimizer_set_loss_scale(opt, -1.0F), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_set_loss_scale: OffloadOptimizer: loss scale -1");
  strata_adam_group_t group;
  expect_error(strata_optimizer_get_group(opt, 5, &group), STRATA_NOT_FOUND,
               "strata_optimizer_get_group: OffloadOptimizer: no parameter group 5");
  expect_error(strata_optimizer_set_group(opt, 0, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_set_group: hyper is NULL");
  expect_error(strata_optimizer_add_group(opt, nullptr, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_add_group: group is NULL");
  std::vector<float> state(63);
  expect_error(strata_optimizer_read_state(opt, id, state.data(), nullptr, nullptr, 63),
               STRATA_INVALID_ARGUMENT,
               "strata_optimizer_read_state: OffloadOptimizer: read_state(w): master");
  expect_error(strata_optimizer_save(opt, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_save: directory is NULL");
  CHECK(strata_optimizer_load(opt, "/nonexistent/strata-checkpoint") != STRATA_OK);
  CHECK(std::string(strata_last_error()).rfind("strata_optimizer_load: ", 0) == 0);
  expect_error(strata_optimizer_stats(opt, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_stats: out is NULL");
  expect_error(strata_optimizer_step(nullptr, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_optimizer_step: optimizer is NULL");
  expect_error(strata_optimizer_zero_grad(reinterpret_cast<strata_optimizer_t*>(s)),
               STRATA_INVALID_ARGUMENT,
               "strata_optimizer_zero_grad: optimizer is a stream handle, not an optimizer handle");

  // The optimizer holds its tensors' state: they cannot be destroyed under it... but the
  // optimizer itself can go, and then every call on it is an error.
  REQUIRE_OK(strata_optimizer_destroy(opt));
  expect_error(strata_optimizer_destroy(opt), STRATA_NOT_FOUND,
               "strata_optimizer_destroy: optimizer was destroyed");
  expect_error(strata_optimizer_step(opt, nullptr), STRATA_NOT_FOUND,
               "strata_optimizer_step: optimizer was destroyed");

  // A runtime's destroy takes its optimizers along.
  REQUIRE_OK(strata_optimizer_create(r, nullptr, &opt));
  REQUIRE_OK(strata_optimizer_add_param(opt, &spec, &id));
  REQUIRE_OK(strata_runtime_destroy(r));
  rt.runtime = nullptr;
  expect_error(strata_optimizer_stats(opt, nullptr), STRATA_NOT_FOUND,
               "strata_optimizer_stats: optimizer was destroyed");
  expect_error(strata_optimizer_destroy(opt), STRATA_NOT_FOUND,
               "strata_optimizer_destroy: optimizer was destroyed");
}

// torch.optim.AdamW on one fp32 parameter, in float as the CPU kernels compute it.
struct AdamW {
  strata_adam_group_t hyper;
  std::vector<float> master, m, v;
  uint64_t steps = 0;
  void step(const std::vector<float>& grad) {
    ++steps;
    const double bc1 = 1.0 - std::pow(double{hyper.beta1}, static_cast<double>(steps));
    const double bc2 = 1.0 - std::pow(double{hyper.beta2}, static_cast<double>(steps));
    for (size_t i = 0; i < master.size(); ++i) {
      const float g = grad[i];
      float p = master[i] * (1.0F - hyper.lr * hyper.weight_decay);
      m[i] = hyper.beta1 * m[i] + (1.0F - hyper.beta1) * g;
      v[i] = hyper.beta2 * v[i] + (1.0F - hyper.beta2) * g * g;
      const double denom = std::sqrt(static_cast<double>(v[i])) / std::sqrt(bc2) + hyper.eps;
      p -= static_cast<float>(hyper.lr / bc1 * m[i] / denom);
      master[i] = p;
    }
  }
};

void expect_near(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-5F * std::max(1.0F, std::fabs(want[i]))) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("c_api: the offload optimizer steps like AdamW, and checkpoints", "[c_api][optimizer]") {
  const strata_tier_t home =
      GENERATE(strata_tier_t{STRATA_TIER_CPU}, strata_tier_t{STRATA_TIER_NVME});
  INFO("states in tier " << home);
  strata::testing::TempDir swap("strata-c-api");
  strata::testing::TempDir checkpoint("strata-c-api-ckpt");
  Vars vars = nvme_vars(swap.path());
  vars.emplace_back("STRATA_CPU_BYTES", "8MiB");
  TestRuntime rt(vars);
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));

  constexpr uint64_t kCount = 3000;
  const int64_t shape[] = {30, 100};
  strata_tensor_t param{};
  strata_tensor_t grad{};
  REQUIRE_OK(strata_tensor_create_ex(r, "layer.weight", STRATA_DTYPE_FLOAT32, shape, 2,
                                     STRATA_TIER_CPU, &param));
  REQUIRE_OK(strata_tensor_create_ex(r, "layer.weight.grad", STRATA_DTYPE_FLOAT32, shape, 2,
                                     STRATA_TIER_CPU, &grad));

  strata_optimizer_options_t options;
  REQUIRE_OK(strata_optimizer_options_init(&options));
  options.state_home = home;
  options.defaults.lr = 1e-2F;
  options.defaults.weight_decay = 0.01F;
  options.isa = STRATA_CPU_ISA_SCALAR;  // the same arithmetic on every machine
  strata_optimizer_t* opt = nullptr;
  REQUIRE_OK(strata_optimizer_create(r, &options, &opt));

  AdamW ref{options.defaults, std::vector<float>(kCount), std::vector<float>(kCount, 0.0F),
            std::vector<float>(kCount, 0.0F)};
  for (uint64_t i = 0; i < kCount; ++i) ref.master[i] = 0.5F * std::sin(static_cast<float>(i));
  strata_param_spec_t spec{};
  spec.name = "layer.weight";
  spec.param = param;
  spec.grad = grad;
  spec.param_type = STRATA_PARAM_F32;
  spec.grad_type = STRATA_GRAD_F32;
  spec.count = kCount;
  spec.initial_master = ref.master.data();
  strata_param_t id{};
  REQUIRE_OK(strata_optimizer_add_param(opt, &spec, &id));
  strata_param_t found{};
  REQUIRE_OK(strata_optimizer_find_param(opt, "layer.weight", &found));
  CHECK(found.index == id.index);

  const auto backward = [&](int step) {
    std::vector<float> g(kCount);
    for (uint64_t i = 0; i < kCount; ++i) {
      g[i] = std::cos(0.37F * static_cast<float>(i) + static_cast<float>(step));
    }
    void* p = nullptr;
    REQUIRE_OK(strata_tensor_acquire(grad, STRATA_TIER_GPU, s, STRATA_ACCESS_WRITE, &p));
    REQUIRE_OK(strata_stream_synchronize(s));  // host backend: "GPU" memory is host memory
    std::memcpy(p, g.data(), kCount * sizeof(float));
    REQUIRE_OK(strata_tensor_release(grad, s));
    REQUIRE_OK(strata_optimizer_grad_ready(opt, id, s));
    return g;
  };
  const auto state = [&] {
    std::vector<float> master(kCount), m(kCount), v(kCount);
    REQUIRE_OK(strata_optimizer_read_state(opt, id, master.data(), m.data(), v.data(), kCount));
    return std::tuple(master, m, v);
  };
  const auto model = [&] {
    std::vector<float> w(kCount);
    void* p = nullptr;
    REQUIRE_OK(strata_tensor_acquire(param, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p));
    std::memcpy(w.data(), p, kCount * sizeof(float));
    REQUIRE_OK(strata_tensor_release(param, s));
    return w;
  };

  CHECK(model() == ref.master);  // the parameter tensor starts from the initial master
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = backward(step);
    strata_step_result_t result{};
    REQUIRE_OK(strata_optimizer_step(opt, &result));
    ref.step(g);
    double sq = 0;
    for (float x : g) sq += double{x} * x;
    CHECK(result.skipped == 0);
    CHECK(result.step == static_cast<uint64_t>(step + 1));
    CHECK(result.params_updated == 1);
    CHECK(result.grad_norm == Approx(std::sqrt(sq)).epsilon(1e-5));
    CHECK(result.clip_coef == 1.0);
    CHECK(result.loss_scale == 1.0F);
    const auto [master, m, v] = state();
    expect_near(master, ref.master);
    expect_near(m, ref.m);
    expect_near(v, ref.v);
    CHECK(model() == master);  // fp32 parameters are the master itself
  }
  uint64_t steps = 0;
  REQUIRE_OK(strata_optimizer_step_count(opt, &steps));
  CHECK(steps == 3);
  REQUIRE_OK(strata_optimizer_param_step_count(opt, id, &steps));
  CHECK(steps == 3);
  strata_optimizer_stats_t stats;
  REQUIRE_OK(strata_optimizer_stats(opt, &stats));
  CHECK(stats.steps == 3);
  CHECK(stats.params == 1);
  CHECK(stats.elements == kCount);
  CHECK(stats.grads_landed == 3);
  CHECK(stats.grad_bytes_landed == 3 * kCount * sizeof(float));
  if (home == STRATA_TIER_NVME) {
    CHECK(stats.chunks >= 1);
    CHECK(stats.nvme_bytes_written > 0);
    CHECK(stats.nvme_bytes_read > 0);
  }

  // Checkpoint, a step that is then undone by load(), and the state is the checkpoint's.
  const std::string dir = checkpoint.path() + "/step3";
  REQUIRE_OK(strata_optimizer_save(opt, dir.c_str()));
  const auto saved = state();
  backward(3);
  REQUIRE_OK(strata_optimizer_step(opt, nullptr));
  CHECK(std::get<0>(state()) != std::get<0>(saved));
  REQUIRE_OK(strata_optimizer_load(opt, dir.c_str()));
  CHECK(state() == saved);
  CHECK(model() == std::get<0>(saved));
  REQUIRE_OK(strata_optimizer_step_count(opt, &steps));
  CHECK(steps == 3);

  // zero_grad drops landed gradients: a step then updates nothing.
  backward(4);
  REQUIRE_OK(strata_optimizer_zero_grad(opt));
  strata_step_result_t result{};
  REQUIRE_OK(strata_optimizer_step(opt, &result));
  CHECK(result.params_updated == 0);

  // Groups and the loss scale.
  strata_adam_group_t group;
  REQUIRE_OK(strata_adam_group_init(&group));
  group.lr = 0.5F;
  group.decoupled = 0;
  uint32_t index = 0;
  REQUIRE_OK(strata_optimizer_add_group(opt, &group, &index));
  CHECK(index == 1);
  strata_adam_group_t back;
  REQUIRE_OK(strata_optimizer_get_group(opt, 1, &back));
  CHECK(back.lr == 0.5F);
  CHECK(back.decoupled == 0);
  back.lr = 0.25F;
  REQUIRE_OK(strata_optimizer_set_group(opt, 0, &back));
  REQUIRE_OK(strata_optimizer_get_group(opt, 0, &group));
  CHECK(group.lr == 0.25F);
  REQUIRE_OK(strata_optimizer_set_loss_scale(opt, 128.0F));
  float scale = 0;
  REQUIRE_OK(strata_optimizer_loss_scale(opt, &scale));
  CHECK(scale == 128.0F);

  REQUIRE_OK(strata_optimizer_destroy(opt));
  REQUIRE_OK(strata_tensor_destroy(param));  // the optimizer no longer uses them
  REQUIRE_OK(strata_tensor_destroy(grad));
}

}  // namespace
}  // namespace strata::testing
