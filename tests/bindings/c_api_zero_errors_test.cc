// The C API's ZeRO engine: every call with a bad argument returns an error code and a message
// naming the argument (or the engine's own message), and leaves the engine usable.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "c_api_fixtures.h"
#include "c_api_zero_fixtures.h"
#include "strata/strata.h"

namespace strata::testing {
namespace {

// strata_zero_engine_create with `options` (tiny_options(2) changed by `edit`).
template <typename Edit>
strata_status_t create_with(strata_runtime_t* r, strata_communicator_t* comm, Edit edit) {
  const TinyModel model;
  auto specs = model.specs();
  strata_zero_options_t options = tiny_options(2);
  edit(options, specs);
  strata_zero_engine_t* engine = nullptr;
  const strata_status_t status =
      strata_zero_engine_create(r, comm, specs.data(), specs.size(), &options, &engine);
  CHECK(engine == nullptr);
  return status;
}

TEST_CASE("c_api: ZeRO engine create with bad arguments", "[c_api][zero]") {
  TestRuntime rt;
  TestRuntime other;
  strata_runtime_t* r = rt.runtime;
  strata_communicator_t* comm = nullptr;
  strata_communicator_t* foreign_comm = nullptr;
  REQUIRE_OK(make_solo_comm(r, &comm));
  REQUIRE_OK(make_solo_comm(other.runtime, &foreign_comm));
  const TinyModel model;
  const auto specs = model.specs();
  strata_zero_engine_t* engine = nullptr;
  const char* fn = "strata_zero_engine_create: ";
  const auto expect = [&](strata_status_t got, const std::string& text) {
    expect_error(got, STRATA_INVALID_ARGUMENT, fn + text);
  };

  expect_error(strata_zero_options_init(nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_options_init: options is NULL");
  strata_zero_options_t defaults;
  REQUIRE_OK(strata_zero_options_init(&defaults));
  CHECK(defaults.stage == 2);
  CHECK(defaults.param_type == STRATA_PARAM_F16);
  CHECK(defaults.grad_type == STRATA_GRAD_F16);
  CHECK(defaults.bucket_bytes == 32U << 20);
  CHECK(defaults.gradient_buckets == 2);
  CHECK(defaults.alignment == 64);
  CHECK(defaults.param_home == STRATA_TIER_GPU);
  CHECK(defaults.accumulation_steps == 1);
  CHECK(defaults.groups == nullptr);
  CHECK(defaults.optimizer.state_home == STRATA_TIER_CPU);
  CHECK(defaults.persist_below_bytes == 128U << 10);
  CHECK(defaults.prefetch_bytes == 64U << 20);
  CHECK(defaults.max_live_bytes == 0);  // automatic
  CHECK(defaults.reuse_window_bytes == 64U << 20);

  expect(strata_zero_engine_create(r, comm, specs.data(), specs.size(), nullptr, nullptr),
         "out is NULL");
  expect(strata_zero_engine_create(nullptr, comm, specs.data(), specs.size(), nullptr, &engine),
         "runtime is NULL");
  expect(strata_zero_engine_create(r, nullptr, specs.data(), specs.size(), nullptr, &engine),
         "comm is NULL");
  expect(strata_zero_engine_create(r, foreign_comm, specs.data(), specs.size(), nullptr, &engine),
         "comm belongs to another runtime than runtime");
  expect(strata_zero_engine_create(r, comm, nullptr, 2, nullptr, &engine),
         "params (with count > 0) is NULL");
  using Specs = std::vector<strata_zero_param_spec_t>;
  expect(create_with(r, comm, [](auto&, Specs& s) { s[1].name = nullptr; }),
         "params[1].name is NULL");
  expect(create_with(r, comm, [](auto&, Specs& s) { s[0].ndim = 9; }),
         "params[0].ndim is 9: at most STRATA_MAX_NDIM (8)");
  expect(create_with(r, comm, [](auto&, Specs& s) { s[0].shape = nullptr; }),
         "params[0].shape (with ndim > 0) is NULL");
  const int64_t zero_dim[] = {3, 0};
  expect(create_with(r, comm, [&](auto&, Specs& s) { s[0].shape = zero_dim; }),
         "params[0] ('layer.weight'): shape[1] is 0: dimensions must be > 0");
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.stage = 4; }),
         "options->stage is 4: use 1 (optimizer states partitioned), 2 (gradients partitioned "
         "too) or 3 (parameters partitioned too)");
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.stage = 0; }),
         "options->stage is 0: use 1");
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.param_type = 7; }),
         "options->param_type is 7: use STRATA_PARAM_F32");
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.grad_type = -1; }),
         "options->grad_type is -1: use STRATA_GRAD_F32");
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.param_home = 9; }),
         "options->param_home is 9: use STRATA_TIER_GPU (0)");
  expect(create_with(r, comm,
                     [](strata_zero_options_t& o, auto&) { o.param_home = STRATA_TIER_NVME; }),
         "options->param_home is STRATA_TIER_NVME at stage 2: the flat parameter tensors of "
         "stages 1 and 2");
  // Stage 3 takes an NVMe home, which needs an NVMe tier (the runtime's message).
  CHECK(create_with(r, comm, [](strata_zero_options_t& o, auto&) {
          o.stage = 3;
          o.param_home = STRATA_TIER_NVME;
        }) != STRATA_OK);
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.group_count = 2; }),
         "options->groups (with group_count > 0) is NULL");
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.optimizer.state_home = 7; }),
         "options->optimizer.state_home is 7");
  expect(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.optimizer.isa = 9; }),
         "options->optimizer.isa is 9");
  // The engine's own checks, with its message.
  CHECK(create_with(r, comm, [](auto&, Specs& s) { s[1].name = "layer.weight"; }) ==
        STRATA_INVALID_ARGUMENT);
  CHECK(std::string(strata_last_error()).find("layer.weight") != std::string::npos);
  CHECK(create_with(r, comm, [](auto&, Specs& s) { s[2].group = 3; }) == STRATA_INVALID_ARGUMENT);
  CHECK(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.alignment = 0; }) ==
        STRATA_INVALID_ARGUMENT);
  CHECK(std::string(strata_last_error()).find("alignment") != std::string::npos);
  CHECK(create_with(r, comm, [](strata_zero_options_t& o, auto&) { o.accumulation_steps = 0; }) ==
        STRATA_INVALID_ARGUMENT);
  CHECK(std::string(strata_last_error()).find("accumulation") != std::string::npos);
  // States on NVMe without an NVMe tier.
  CHECK(create_with(r, comm, [](strata_zero_options_t& o, auto&) {
          o.optimizer.state_home = STRATA_TIER_NVME;
        }) != STRATA_OK);
  // None of these left anything behind: the same engine can be created now.
  REQUIRE_OK(strata_zero_engine_create(r, comm, specs.data(), specs.size(), nullptr, &engine));
  REQUIRE_OK(strata_zero_engine_destroy(engine));
  expect_error(strata_zero_engine_destroy(engine), STRATA_NOT_FOUND,
               "strata_zero_engine_destroy: engine was destroyed");
}

TEST_CASE("c_api: ZeRO engine calls with bad arguments", "[c_api][zero]") {
  TestRuntime rt;
  TestRuntime other;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  strata_stream_t* foreign_stream = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  REQUIRE_OK(strata_stream_create(other.runtime, &foreign_stream));
  strata_communicator_t* comm = nullptr;
  REQUIRE_OK(make_solo_comm(r, &comm));
  const TinyModel model;
  const auto specs = model.specs();
  const strata_zero_options_t options = tiny_options(1);
  strata_zero_engine_t* e = nullptr;
  REQUIRE_OK(strata_zero_engine_create(r, comm, specs.data(), specs.size(), &options, &e));

  const strata_zero_param_t bad{99};
  const strata_zero_param_t p{0};
  const std::string no_param = "param 99 is not a parameter of this engine (it has 3)";
  void* data = nullptr;
  strata_zero_param_t found{};
  expect_error(strata_zero_engine_find(e, nullptr, &found), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_find: name is NULL");
  expect_error(strata_zero_engine_find(e, "w", nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_find: out is NULL");
  CHECK(strata_zero_engine_find(e, "no.such.param", &found) == STRATA_NOT_FOUND);
  CHECK(std::string(strata_last_error()).find("no.such.param") != std::string::npos);
  CHECK(found.index == UINT32_MAX);
  strata_zero_param_info_t info;
  expect_error(strata_zero_engine_param_info(e, bad, &info), STRATA_NOT_FOUND,
               "strata_zero_engine_param_info: " + no_param);
  expect_error(strata_zero_engine_param_info(e, p, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_param_info: out is NULL");
  expect_error(strata_zero_engine_param_name(e, bad, nullptr, 0, nullptr), STRATA_NOT_FOUND,
               "strata_zero_engine_param_name: " + no_param);
  expect_error(strata_zero_engine_param_name(e, p, nullptr, 3, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_param_name: buffer (with size > 0) is NULL");
  strata_zero_view_t view;
  expect_error(strata_zero_engine_param_view(e, bad, &view), STRATA_NOT_FOUND,
               "strata_zero_engine_param_view: " + no_param);
  expect_error(strata_zero_engine_param_view(e, p, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_param_view: out is NULL");
  expect_error(
      strata_zero_engine_acquire_param(e, bad, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &data),
      STRATA_NOT_FOUND, "strata_zero_engine_acquire_param: " + no_param);
  expect_error(strata_zero_engine_acquire_param(e, p, 5, s, STRATA_ACCESS_READ, &data),
               STRATA_INVALID_ARGUMENT, "strata_zero_engine_acquire_param: tier is 5");
  expect_error(strata_zero_engine_acquire_param(e, p, STRATA_TIER_CPU, s, 5, &data),
               STRATA_INVALID_ARGUMENT, "strata_zero_engine_acquire_param: mode is 5");
  expect_error(
      strata_zero_engine_acquire_param(e, p, STRATA_TIER_CPU, nullptr, STRATA_ACCESS_READ, &data),
      STRATA_INVALID_ARGUMENT, "strata_zero_engine_acquire_param: stream is NULL");
  expect_error(strata_zero_engine_acquire_param(e, p, STRATA_TIER_CPU, foreign_stream,
                                                STRATA_ACCESS_READ, &data),
               STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_acquire_param: stream belongs to another runtime than engine");
  expect_error(
      strata_zero_engine_acquire_param(e, p, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, nullptr),
      STRATA_INVALID_ARGUMENT, "strata_zero_engine_acquire_param: out is NULL");
  CHECK(data == nullptr);
  expect_error(strata_zero_engine_release_param(e, bad, s), STRATA_NOT_FOUND,
               "strata_zero_engine_release_param: " + no_param);
  // A release without an acquire: the store's message.
  CHECK(strata_zero_engine_release_param(e, p, s) == STRATA_FAILED_PRECONDITION);
  expect_error(strata_zero_engine_acquire_grad(e, bad, STRATA_TIER_CPU, s, &data), STRATA_NOT_FOUND,
               "strata_zero_engine_acquire_grad: " + no_param);
  expect_error(strata_zero_engine_acquire_grad(e, p, -1, s, &data), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_acquire_grad: tier is -1");
  expect_error(strata_zero_engine_acquire_grad(e, p, STRATA_TIER_CPU, foreign_stream, &data),
               STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_acquire_grad: stream belongs to another runtime than engine");
  expect_error(strata_zero_engine_acquire_grad(e, p, STRATA_TIER_CPU, s, nullptr),
               STRATA_INVALID_ARGUMENT, "strata_zero_engine_acquire_grad: out is NULL");
  expect_error(strata_zero_engine_grad_ready(e, bad, s), STRATA_NOT_FOUND,
               "strata_zero_engine_grad_ready: " + no_param);
  expect_error(strata_zero_engine_grad_ready(e, p, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_grad_ready: stream is NULL");
  std::vector<float> buffer(15);
  expect_error(strata_zero_engine_read_state(e, bad, buffer.data(), nullptr, nullptr, 15),
               STRATA_NOT_FOUND, "strata_zero_engine_read_state: " + no_param);
  expect_error(strata_zero_engine_read_state(e, p, buffer.data(), nullptr, nullptr, 14),
               STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_read_state: count is 14: parameter 'layer.weight' has 15 "
               "elements");
  REQUIRE_OK(strata_zero_engine_read_state(e, p, nullptr, nullptr, nullptr, 0));
  expect_error(strata_zero_engine_save(e, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_save: directory is NULL");
  expect_error(strata_zero_engine_load(e, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_load: directory is NULL");
  CHECK(strata_zero_engine_load(e, "/nonexistent/strata-zero-checkpoint") != STRATA_OK);
  CHECK(std::string(strata_last_error()).find("/nonexistent/strata-zero-checkpoint") !=
        std::string::npos);
  expect_error(strata_zero_engine_param_count(e, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_param_count: out is NULL");
  expect_error(strata_zero_engine_layout(e, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_layout: out is NULL");
  expect_error(strata_zero_engine_memory(e, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_memory: out is NULL");
  expect_error(strata_zero_engine_stats(e, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_stats: out is NULL");
  expect_error(strata_zero_engine_set_fetch_order(e, nullptr, 2), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_set_fetch_order: order (with count > 0) is NULL");
  const strata_zero_param_t order[] = {p, bad};
  expect_error(strata_zero_engine_set_fetch_order(e, order, 2), STRATA_NOT_FOUND,
               "strata_zero_engine_set_fetch_order: order[1]: " + no_param);
  // Only stage 3 fetches: the engine's message.
  expect_error(strata_zero_engine_set_fetch_order(e, order, 1), STRATA_FAILED_PRECONDITION,
               "strata_zero_engine_set_fetch_order: ZeroEngine::set_fetch_order: only stage 3");
  strata_adam_group_t hyper{};
  REQUIRE_OK(strata_zero_engine_get_group(e, 0, &hyper));
  expect_error(strata_zero_engine_get_group(e, 0, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_get_group: out is NULL");
  CHECK(strata_zero_engine_get_group(e, 1, &hyper) == STRATA_NOT_FOUND);
  expect_error(strata_zero_engine_set_group(e, 0, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_set_group: hyper is NULL");
  expect_error(strata_zero_engine_set_group(e, 1, &hyper), STRATA_NOT_FOUND,
               "strata_zero_engine_set_group: ZeroEngine::set_group: no hyper-parameter group 1; "
               "the engine has 1 (ZeroOptions::groups)");
  strata_adam_group_t negative = hyper;
  negative.lr = -1.0F;
  CHECK(strata_zero_engine_set_group(e, 0, &negative) == STRATA_INVALID_ARGUMENT);
  CHECK(std::string(strata_last_error()).find("lr") != std::string::npos);
  expect_error(strata_zero_engine_step(nullptr, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_step: engine is NULL");
  expect_error(strata_zero_engine_step(reinterpret_cast<strata_zero_engine_t*>(comm), nullptr),
               STRATA_INVALID_ARGUMENT,
               "strata_zero_engine_step: engine is a communicator handle, not a ZeRO engine "
               "handle");
  expect_error(strata_communicator_rank(reinterpret_cast<strata_communicator_t*>(e), nullptr),
               STRATA_INVALID_ARGUMENT,
               "strata_communicator_rank: comm is a ZeRO engine handle, not a communicator "
               "handle");

  // After all that the engine still trains.
  for (uint32_t i = 0; i < 3; ++i) {
    add_grad(e, strata_zero_param_t{i}, s, std::vector<float>(model.count(i), 0.5F));
  }
  strata_step_result_t result{};
  REQUIRE_OK(strata_zero_engine_step(e, &result));
  CHECK(result.step == 1);
  CHECK(result.skipped == 0);
}

}  // namespace
}  // namespace strata::testing
