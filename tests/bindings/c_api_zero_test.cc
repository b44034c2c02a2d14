// The C API's communicator and ZeRO engine in one process (a job of one rank): the engine steps
// as the offload optimizer does, checkpoints round-trip, and every bad argument is an error code
// with a message naming it. Several ranks: c_api_zero_ranks_test.cc.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "c_api_fixtures.h"
#include "c_api_zero_fixtures.h"
#include "strata/strata.h"
#include "temp_dir.h"

namespace strata::testing {
namespace {

TEST_CASE("c_api: a communicator alone is a job of one rank", "[c_api][zero]") {
  TestRuntime rt;
  strata_communicator_t* comm = nullptr;
  REQUIRE_OK(make_solo_comm(rt.runtime, &comm));
  int32_t rank = -1;
  int32_t size = -1;
  strata_comm_backend_t backend = 0;
  REQUIRE_OK(strata_communicator_rank(comm, &rank));
  REQUIRE_OK(strata_communicator_size(comm, &size));
  REQUIRE_OK(strata_communicator_backend(comm, &backend));
  CHECK(rank == 0);
  CHECK(size == 1);
  CHECK(backend == STRATA_COMM_BACKEND_GLOO);
  size_t length = 0;
  REQUIRE_OK(strata_communicator_describe(comm, nullptr, 0, &length));
  std::string text(length + 1, '\0');
  REQUIRE_OK(strata_communicator_describe(comm, text.data(), text.size(), nullptr));
  text.resize(length);
  CHECK(text.find("gloo") != std::string::npos);
  strata_comm_stats_t stats;
  REQUIRE_OK(strata_communicator_stats(comm, &stats));
  CHECK(stats.total_bytes == 0);
  CHECK(stats.by_kind[STRATA_COLLECTIVE_ALL_REDUCE].calls == 0);
  REQUIRE_OK(strata_communicator_destroy(comm));
  expect_error(strata_communicator_rank(comm, &rank), STRATA_NOT_FOUND,
               "strata_communicator_rank: comm was destroyed");

  // From the environment: no launch variables is a job of one.
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK"}) unsetenv(name);
  setenv("MASTER_PORT", std::to_string(free_port()).c_str(), 1);
  REQUIRE_OK(strata_communicator_create_from_env(rt.runtime, &comm));
  REQUIRE_OK(strata_communicator_size(comm, &size));
  CHECK(size == 1);
  // The runtime's destroy takes its communicators with it.
  REQUIRE_OK(strata_runtime_destroy(rt.runtime));
  rt.runtime = nullptr;
  expect_error(strata_communicator_size(comm, &size), STRATA_NOT_FOUND,
               "strata_communicator_size: comm was destroyed");
}

TEST_CASE("c_api: communicator calls with bad arguments return an error code and a message",
          "[c_api][zero]") {
  TestRuntime rt;
  strata_runtime_t* r = rt.runtime;
  strata_communicator_t* comm = nullptr;
  expect_error(strata_communicator_create(r, nullptr, 0, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_communicator_create: out is NULL");
  expect_error(strata_communicator_create_from_env(nullptr, &comm), STRATA_INVALID_ARGUMENT,
               "strata_communicator_create_from_env: runtime is NULL");
  expect_error(strata_communicator_create(r, nullptr, 1, &comm), STRATA_INVALID_ARGUMENT,
               "strata_communicator_create: settings (with count > 0) is NULL");
  const strata_setting_t unnamed[] = {{nullptr, "1"}};
  expect_error(strata_communicator_create(r, unnamed, 1, &comm), STRATA_INVALID_ARGUMENT,
               "strata_communicator_create: settings[0].name is NULL");
  const strata_setting_t foreign[] = {{"OMP_NUM_THREADS", "1"}};
  expect_error(strata_communicator_create(r, foreign, 1, &comm), STRATA_INVALID_ARGUMENT,
               "strata_communicator_create: settings[0].name 'OMP_NUM_THREADS' is neither a "
               "launch variable (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) nor a "
               "STRATA_* variable");
  const strata_setting_t bad_rank[] = {{"RANK", "2"}, {"WORLD_SIZE", "2"}};
  CHECK(strata_communicator_create(r, bad_rank, 2, &comm) == STRATA_INVALID_ARGUMENT);
  CHECK(std::string(strata_last_error()).find("RANK") != std::string::npos);
  const strata_setting_t bad_timeout[] = {{"STRATA_COMM_TIMEOUT", "soon"}};
  CHECK(strata_communicator_create(r, bad_timeout, 1, &comm) == STRATA_INVALID_ARGUMENT);
  CHECK(std::string(strata_last_error()).find("STRATA_COMM_TIMEOUT='soon'") != std::string::npos);
  CHECK(comm == nullptr);

  REQUIRE_OK(make_solo_comm(r, &comm));
  int32_t value = 0;
  expect_error(strata_communicator_rank(nullptr, &value), STRATA_INVALID_ARGUMENT,
               "strata_communicator_rank: comm is NULL");
  expect_error(strata_communicator_rank(comm, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_communicator_rank: out is NULL");
  expect_error(strata_communicator_size(comm, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_communicator_size: out is NULL");
  expect_error(strata_communicator_backend(comm, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_communicator_backend: out is NULL");
  expect_error(strata_communicator_stats(comm, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_communicator_stats: out is NULL");
  expect_error(strata_communicator_describe(comm, nullptr, 4, nullptr), STRATA_INVALID_ARGUMENT,
               "strata_communicator_describe: buffer (with size > 0) is NULL");
  strata_stream_t* stream = nullptr;
  REQUIRE_OK(strata_stream_create(r, &stream));
  expect_error(strata_communicator_rank(reinterpret_cast<strata_communicator_t*>(stream), &value),
               STRATA_INVALID_ARGUMENT,
               "strata_communicator_rank: comm is a stream handle, not a communicator handle");
  REQUIRE_OK(strata_communicator_destroy(comm));
  expect_error(strata_communicator_destroy(comm), STRATA_NOT_FOUND,
               "strata_communicator_destroy: comm was destroyed");
}

// Writes `g` into the optimizer's gradient tensor and marks it ready.
void optimizer_grad(strata_optimizer_t* opt, strata_param_t p, strata_tensor_t grad,
                    strata_stream_t* s, const std::vector<float>& g) {
  void* data = nullptr;
  REQUIRE_OK(strata_tensor_acquire(grad, STRATA_TIER_CPU, s, STRATA_ACCESS_WRITE, &data));
  REQUIRE_OK(strata_stream_synchronize(s));
  std::memcpy(data, g.data(), g.size() * sizeof(float));
  REQUIRE_OK(strata_tensor_release(grad, s));
  REQUIRE_OK(strata_optimizer_grad_ready(opt, p, s));
}

std::vector<float> gradient(size_t p, size_t step, size_t count) {
  std::vector<float> g(count);
  for (size_t i = 0; i < count; ++i) {
    g[i] = 0.5F * std::cos(static_cast<float>(13 * p + 5 * step + i));
  }
  return g;
}

TEST_CASE("c_api: a ZeRO engine of one rank steps as the offload optimizer does", "[c_api][zero]") {
  const auto [stage, param_type] =
      GENERATE(std::pair{1U, STRATA_PARAM_F32}, std::pair{2U, STRATA_PARAM_F32},
               std::pair{2U, STRATA_PARAM_F16}, std::pair{3U, STRATA_PARAM_F32},
               std::pair{3U, STRATA_PARAM_F16});
  INFO("stage " << stage << ", param type " << param_type);
  TestRuntime rt;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  strata_communicator_t* comm = nullptr;
  REQUIRE_OK(make_solo_comm(r, &comm));
  const TinyModel model;
  const auto specs = model.specs();
  strata_zero_options_t options = tiny_options(stage);
  options.param_type = param_type;
  strata_zero_engine_t* engine = nullptr;
  REQUIRE_OK(strata_zero_engine_create(r, comm, specs.data(), specs.size(), &options, &engine));

  // The reference: the offload optimizer with the same options, one tensor per parameter.
  strata_optimizer_t* opt = nullptr;
  REQUIRE_OK(strata_optimizer_create(r, &options.optimizer, &opt));
  const size_t item = param_type == STRATA_PARAM_F32 ? 4 : 2;
  std::vector<strata_param_t> ref(specs.size());
  std::vector<strata_tensor_t> ref_param(specs.size());
  std::vector<strata_tensor_t> ref_grad(specs.size());
  std::vector<strata_zero_param_t> ids(specs.size());
  for (size_t p = 0; p < specs.size(); ++p) {
    const std::string name = "ref." + model.names[p];
    REQUIRE_OK(strata_tensor_create(r, name.c_str(), model.count(p) * item, STRATA_TIER_CPU,
                                    &ref_param[p]));
    REQUIRE_OK(strata_tensor_create(r, (name + ".grad").c_str(), model.count(p) * 4,
                                    STRATA_TIER_CPU, &ref_grad[p]));
    const strata_param_spec_t spec{
        name.c_str(),    ref_param[p],   ref_grad[p], param_type,
        STRATA_GRAD_F32, model.count(p), 0,           model.initial[p].data()};
    REQUIRE_OK(strata_optimizer_add_param(opt, &spec, &ref[p]));
    REQUIRE_OK(strata_zero_engine_find(engine, model.names[p].c_str(), &ids[p]));
    CHECK(ids[p].index == p);
  }

  for (size_t step = 1; step <= 3; ++step) {
    if (step == 2) {  // a learning-rate schedule's change, in both: the states stay equal
      strata_adam_group_t hyper{};
      REQUIRE_OK(strata_zero_engine_get_group(engine, 0, &hyper));
      CHECK(hyper.lr == options.optimizer.defaults.lr);
      hyper.lr *= 0.25F;
      REQUIRE_OK(strata_zero_engine_set_group(engine, 0, &hyper));
      REQUIRE_OK(strata_optimizer_set_group(opt, 0, &hyper));
      strata_adam_group_t back{};
      REQUIRE_OK(strata_zero_engine_get_group(engine, 0, &back));
      CHECK(back.lr == options.optimizer.defaults.lr * 0.25F);
    }
    for (size_t p = 0; p < specs.size(); ++p) {
      const auto g = gradient(p, step, model.count(p));
      add_grad(engine, ids[p], s, g);
      optimizer_grad(opt, ref[p], ref_grad[p], s, g);
    }
    strata_step_result_t got{};
    strata_step_result_t want{};
    REQUIRE_OK(strata_zero_engine_step(engine, &got));
    REQUIRE_OK(strata_optimizer_step(opt, &want));
    CHECK(got.skipped == 0);
    CHECK(got.step == step);
    CHECK(got.step == want.step);
    CHECK(got.grad_norm == Approx(want.grad_norm).epsilon(1e-6));
    CHECK(got.loss_scale == want.loss_scale);
    for (size_t p = 0; p < specs.size(); ++p) {
      const size_t n = model.count(p);
      std::vector<float> m(n), v(n), v2(n), rm(n), rv(n), rv2(n);
      REQUIRE_OK(strata_zero_engine_read_state(engine, ids[p], m.data(), v.data(), v2.data(), n));
      REQUIRE_OK(strata_optimizer_read_state(opt, ref[p], rm.data(), rv.data(), rv2.data(), n));
      CHECK(same_bits(m, rm));
      CHECK(same_bits(v, rv));
      CHECK(same_bits(v2, rv2));
      // The model's copy: the master rounded, as the optimizer's parameter tensor.
      void* mine = nullptr;
      void* theirs = nullptr;
      REQUIRE_OK(strata_zero_engine_acquire_param(engine, ids[p], STRATA_TIER_CPU, s,
                                                  STRATA_ACCESS_READ, &mine));
      REQUIRE_OK(
          strata_tensor_acquire(ref_param[p], STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &theirs));
      REQUIRE_OK(strata_stream_synchronize(s));
      CHECK(std::memcmp(mine, theirs, n * item) == 0);
      REQUIRE_OK(strata_tensor_release(ref_param[p], s));
      REQUIRE_OK(strata_zero_engine_release_param(engine, ids[p], s));
    }
  }
  strata_zero_stats_t stats;
  REQUIRE_OK(strata_zero_engine_stats(engine, &stats));
  CHECK(stats.steps == 3);
  CHECK(stats.micro_steps == 0);
}

TEST_CASE("c_api: ZeRO engine checkpoints, layout, memory and parameter views", "[c_api][zero]") {
  TestRuntime rt;
  TempDir dir("strata-c-zero");
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  strata_communicator_t* comm = nullptr;
  REQUIRE_OK(make_solo_comm(r, &comm));
  const TinyModel model;
  const auto specs = model.specs();
  const strata_zero_options_t options = tiny_options(2);
  strata_zero_engine_t* engine = nullptr;
  REQUIRE_OK(strata_zero_engine_create(r, comm, specs.data(), specs.size(), &options, &engine));
  // The handle may go: the engine keeps the communicator.
  REQUIRE_OK(strata_communicator_destroy(comm));

  uint32_t count = 0;
  REQUIRE_OK(strata_zero_engine_param_count(engine, &count));
  REQUIRE(count == 3);
  strata_zero_param_info_t info;
  REQUIRE_OK(strata_zero_engine_param_info(engine, strata_zero_param_t{0}, &info));
  CHECK(info.count == 15);
  CHECK(info.ndim == 2);
  CHECK(info.shape[0] == 3);
  CHECK(info.shape[1] == 5);
  CHECK(info.shape[2] == 0);
  CHECK(info.group == 0);
  REQUIRE_OK(strata_zero_engine_param_info(engine, strata_zero_param_t{2}, &info));
  CHECK(info.count == 1);
  CHECK(info.ndim == 1);  // the engine records a scalar's shape as {1}
  CHECK(info.shape[0] == 1);
  char name[8];
  size_t length = 0;
  REQUIRE_OK(
      strata_zero_engine_param_name(engine, strata_zero_param_t{1}, name, sizeof(name), &length));
  CHECK(length == std::string("layer.bias").size());
  CHECK(std::string(name) == "layer.b");  // truncated to the buffer, NUL-terminated

  strata_zero_layout_t layout;
  REQUIRE_OK(strata_zero_engine_layout(engine, &layout));
  CHECK(layout.ranks == 1);
  CHECK(layout.alignment == 4);
  CHECK(layout.elements == 15 + 7 + 1);
  CHECK(layout.groups >= 2);  // 16 elements a group at most
  CHECK(layout.padded_elements % 4 == 0);
  CHECK(layout.padded_elements >= layout.elements);
  CHECK(layout.shard_elements == layout.padded_elements);

  strata_zero_view_t view;
  REQUIRE_OK(strata_zero_engine_param_view(engine, strata_zero_param_t{1}, &view));
  CHECK(view.count == 7);
  strata_tensor_info_t tensor;
  REQUIRE_OK(strata_tensor_info(view.tensor, &tensor));
  CHECK(view.offset + view.count * 4 <= tensor.bytes);
  CHECK(same_bits(read_param(engine, strata_zero_param_t{1}, s, 7), model.initial[1]));

  const auto train = [&](size_t step) {
    for (uint32_t p = 0; p < 3; ++p) {
      add_grad(engine, strata_zero_param_t{p}, s, gradient(p, step, model.count(p)));
    }
    REQUIRE_OK(strata_zero_engine_step(engine, nullptr));
  };
  train(1);
  train(2);
  REQUIRE_OK(strata_zero_engine_save(engine, dir.path().c_str()));
  train(3);
  std::vector<std::vector<float>> after;
  for (uint32_t p = 0; p < 3; ++p) {
    after.push_back(read_param(engine, strata_zero_param_t{p}, s, model.count(p)));
  }
  REQUIRE_OK(strata_zero_engine_load(engine, dir.path().c_str()));
  // A gradient added and dropped does not count.
  add_grad(engine, strata_zero_param_t{0}, s, std::vector<float>(15, 100.0F));
  REQUIRE_OK(strata_zero_engine_zero_grad(engine));
  train(3);
  for (uint32_t p = 0; p < 3; ++p) {
    CHECK(same_bits(read_param(engine, strata_zero_param_t{p}, s, model.count(p)), after[p]));
  }

  strata_zero_memory_t memory;
  REQUIRE_OK(strata_zero_engine_memory(engine, &memory));
  CHECK(memory.params[STRATA_TIER_CPU] >= layout.padded_elements * 4);
  CHECK(memory.params[STRATA_TIER_GPU] == 0);
  CHECK(memory.optimizer_states[STRATA_TIER_CPU] >= layout.shard_elements * 12);
  uint64_t total = 0;
  for (int t = 0; t < STRATA_TIER_COUNT; ++t) {
    total += memory.params[t] + memory.grads[t] + memory.optimizer_states[t];
  }
  CHECK(memory.model_states == total);
  strata_zero_stats_t stats;
  REQUIRE_OK(strata_zero_engine_stats(engine, &stats));
  CHECK(stats.reduce_scatters > 0);
  CHECK(stats.all_gathers > 0);
  // The runtime's destroy takes the engine with it.
  REQUIRE_OK(strata_runtime_destroy(r));
  rt.runtime = nullptr;
  expect_error(strata_zero_engine_step(engine, nullptr), STRATA_NOT_FOUND,
               "strata_zero_engine_step: engine was destroyed");
}

TEST_CASE("c_api: a ZeRO stage 3 engine gathers its parameters from any tier", "[c_api][zero]") {
  const strata_tier_t home =
      GENERATE(as<strata_tier_t>{}, STRATA_TIER_GPU, STRATA_TIER_CPU, STRATA_TIER_NVME);
  INFO("param_home " << home);
  TempDir dir("strata-c-zero3");
  TestRuntime rt(home == STRATA_TIER_NVME ? nvme_vars(dir.path()) : Vars{});
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  strata_communicator_t* comm = nullptr;
  REQUIRE_OK(make_solo_comm(r, &comm));
  const TinyModel model;
  const auto specs = model.specs();
  strata_zero_options_t options = tiny_options(3);
  options.param_home = home;
  options.prefetch_bytes = 64;      // one group (16 fp32) ahead
  options.max_live_bytes = 3 * 64;  // three groups gathered at most
  options.reuse_window_bytes = 64;
  strata_zero_engine_t* engine = nullptr;
  REQUIRE_OK(strata_zero_engine_create(r, comm, specs.data(), specs.size(), &options, &engine));
  const strata_zero_param_t weight{0};
  const strata_zero_param_t bias{1};
  const strata_zero_param_t scale{2};

  // Partitioned parameters have no view and are read-only; the persistent scalar is as at
  // stage 2.
  strata_zero_view_t view;
  expect_error(strata_zero_engine_param_view(engine, weight, &view), STRATA_FAILED_PRECONDITION,
               "strata_zero_engine_param_view: ZeroEngine::param_view: at stage 3 parameter "
               "'layer.weight' exists whole only while gathered");
  REQUIRE_OK(strata_zero_engine_param_view(engine, scale, &view));
  CHECK(view.count == 1);
  void* data = nullptr;
  expect_error(
      strata_zero_engine_acquire_param(engine, bias, STRATA_TIER_GPU, s, STRATA_ACCESS_WRITE,
                                       &data),
      STRATA_INVALID_ARGUMENT,
      "strata_zero_engine_acquire_param: ZeroEngine::acquire_param: parameter 'layer.bias' is "
      "partitioned (stage 3)");
  CHECK(data == nullptr);
  // Gathered whole, from the shard in its home: the initial values.
  for (uint32_t p = 0; p < 3; ++p) {
    CHECK(
        same_bits(read_param(engine, strata_zero_param_t{p}, s, model.count(p)), model.initial[p]));
  }
  strata_zero_memory_t memory;
  REQUIRE_OK(strata_zero_engine_memory(engine, &memory));
  CHECK(memory.params[home] > 0);
  CHECK(memory.gathered <= options.max_live_bytes);
  strata_zero_layout_t layout;
  REQUIRE_OK(strata_zero_engine_layout(engine, &layout));
  CHECK(layout.groups >= 3);  // the weight's two groups, the bias's, the scalar's own

  // A trainer's step: forward uses every parameter, backward each again in reverse, adding its
  // gradient; then step().
  const auto train = [&](size_t step) {
    for (uint32_t p = 0; p < 3; ++p) (void)read_param(engine, strata_zero_param_t{p}, s, 1);
    for (uint32_t p = 3; p-- > 0;) {
      const strata_zero_param_t id{p};
      REQUIRE_OK(strata_zero_engine_acquire_param(engine, id, STRATA_TIER_GPU, s,
                                                  STRATA_ACCESS_READ, &data));
      add_grad(engine, id, s, gradient(p, step, model.count(p)));
      REQUIRE_OK(strata_zero_engine_release_param(engine, id, s));
    }
    strata_step_result_t result{};
    REQUIRE_OK(strata_zero_engine_step(engine, &result));
    CHECK(result.step == step);
  };
  // A parameter still acquired blocks step(), with the engine's message.
  REQUIRE_OK(strata_zero_engine_acquire_param(engine, bias, STRATA_TIER_CPU, s, STRATA_ACCESS_READ,
                                              &data));
  CHECK(strata_zero_engine_step(engine, nullptr) == STRATA_FAILED_PRECONDITION);
  CHECK(std::string(strata_last_error()).find("layer.bias") != std::string::npos);
  REQUIRE_OK(strata_zero_engine_release_param(engine, bias, s));
  train(1);
  strata_zero_stats_t first;
  REQUIRE_OK(strata_zero_engine_stats(engine, &first));
  train(2);  // along the order step 1 recorded: prefetched
  strata_zero_stats_t stats;
  REQUIRE_OK(strata_zero_engine_stats(engine, &stats));
  CHECK(stats.steps == 2);
  CHECK(stats.fetches > first.fetches);
  CHECK(stats.gathers_prefetched > first.gathers_prefetched);
  CHECK(stats.gathered_peak_bytes > 0);
  CHECK(stats.gathered_peak_bytes <= options.max_live_bytes);
  CHECK(stats.gathered_bytes <= options.max_live_bytes);
  CHECK(stats.gathers_on_demand + stats.gathers_prefetched <= stats.all_gathers);
  CHECK(stats.order_changes == first.order_changes);  // the same order both steps

  // The order given up front: backward only, then forward. The next step departs from it and
  // realigns without an error.
  const strata_zero_param_t order[] = {scale, bias, weight};
  REQUIRE_OK(strata_zero_engine_set_fetch_order(engine, order, 3));
  train(3);
  REQUIRE_OK(strata_zero_engine_stats(engine, &stats));
  CHECK(stats.order_changes > first.order_changes);
  // Stage 3 steps as stage 2 would: the masters match a stage-2 engine fed the same gradients.
  strata_zero_options_t two = tiny_options(2);
  TestRuntime rt2;
  strata_communicator_t* comm2 = nullptr;
  REQUIRE_OK(make_solo_comm(rt2.runtime, &comm2));
  strata_stream_t* s2 = nullptr;
  REQUIRE_OK(strata_stream_create(rt2.runtime, &s2));
  strata_zero_engine_t* ref = nullptr;
  REQUIRE_OK(strata_zero_engine_create(rt2.runtime, comm2, specs.data(), specs.size(), &two, &ref));
  for (size_t step = 1; step <= 3; ++step) {
    for (uint32_t p = 3; p-- > 0;) {
      add_grad(ref, strata_zero_param_t{p}, s2, gradient(p, step, model.count(p)));
    }
    REQUIRE_OK(strata_zero_engine_step(ref, nullptr));
  }
  for (uint32_t p = 0; p < 3; ++p) {
    const size_t n = model.count(p);
    std::vector<float> m(n), v(n), rm(n), rv(n);
    REQUIRE_OK(strata_zero_engine_read_state(engine, strata_zero_param_t{p}, m.data(), v.data(),
                                             nullptr, n));
    REQUIRE_OK(strata_zero_engine_read_state(ref, strata_zero_param_t{p}, rm.data(), rv.data(),
                                             nullptr, n));
    CHECK(same_bits(m, rm));
    CHECK(same_bits(v, rv));
    CHECK(same_bits(read_param(engine, strata_zero_param_t{p}, s, n), m));
  }
  // A stage-3 checkpoint loads into the stage-2 engine (and back).
  const std::string ckpt = dir.path() + "/ckpt";
  REQUIRE_OK(strata_zero_engine_save(engine, ckpt.c_str()));
  train(4);
  REQUIRE_OK(strata_zero_engine_load(engine, ckpt.c_str()));
  REQUIRE_OK(strata_zero_engine_load(ref, ckpt.c_str()));
  for (uint32_t p = 0; p < 3; ++p) {
    const size_t n = model.count(p);
    CHECK(same_bits(read_param(engine, strata_zero_param_t{p}, s, n),
                    read_param(ref, strata_zero_param_t{p}, s2, n)));
  }
}

}  // namespace
}  // namespace strata::testing
