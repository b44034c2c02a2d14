// ZeRO-DP stages 1 and 2, run by every rank of a job (CTest starts it under strata-run with 2,
// 3 and 4 ranks over loopback, Gloo). Each rank also trains the one-rank reference (zero_rig.h)
// in its own process, so it can check every step: the same step results and the same
// parameters as one rank, bit for bit, the model-state bytes of the ZeRO formulas
// read from the store, and the bytes the Communicator moved.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/testing/zero_testing.h"
#include "strata/zero/zero_engine.h"
#include "temp_dir.h"
#include "zero/zero_rig.h"

namespace strata {
namespace {

using testing::TempDir;
using testing::ZeroModel;
using testing::ZeroReference;

Communicator& comm() { return testing::job_communicator(); }

uint32_t ranks() { return static_cast<uint32_t>(comm().size()); }
uint32_t my_rank() { return static_cast<uint32_t>(comm().rank()); }
// Sums of dyadic gradients are exact in any order (zero_rig.h): every comparison is bitwise.
void check_same(double got, double want, const char* what) {
  INFO(what << ": got " << got << ", one rank " << want);
  CHECK(got == want);
}

void check_same(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  uint64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) ++differ;
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) /
                                std::max(1.0, std::fabs(static_cast<double>(want[i]))));
  }
  INFO(what << ": " << differ << " of " << got.size() << " values differ, worst " << worst);
  CHECK(differ == 0);
}

struct Variant {
  const char* name;
  uint32_t stage;
  TierKind states;
  ParamType param_type;
  uint32_t micro_steps;
  float max_grad_norm;
  int64_t overflow_step;
  uint64_t bucket_bytes;
  // Parameters homed in the CPU tier with a GPU arena smaller than the model: every access moves
  // them, and the host must wait for those copies.
  TierKind param_home = TierKind::kGpu;
  const char* gpu_bytes = "64MiB";
  // Gloo's data through pinned bounce buffers, as on a CUDA device (zero_testing.h).
  bool bounce = false;
};

TEST_CASE("ZeRO stages 1 and 2 train as one rank does", "[zero]") {
  const Variant v = GENERATE(
      Variant{"stage 1, cpu states, fp16", 1, TierKind::kCpu, ParamType::kF16, 1, 0.0F, -1,
              8 << 10},
      // fp16 runs scale the loss by 1024: their unscaled gradients' norms are about 0.03-0.06.
      Variant{"stage 2, cpu states, fp16, clipped, overflow at step 4", 2, TierKind::kCpu,
              ParamType::kF16, 1, 0.02F, 4, 8 << 10},
      Variant{"stage 2, nvme states, fp16, 2 micro-steps, clipped", 2, TierKind::kNvme,
              ParamType::kF16, 2, 0.03F, -1, 6 << 10},
      Variant{"stage 1, nvme states, fp32, 2 micro-steps, overflow at step 2", 1, TierKind::kNvme,
              ParamType::kF32, 2, 0.0F, 2, 16 << 10},
      Variant{"stage 2, cpu states, fp32, one bucket, large groups", 2, TierKind::kCpu,
              ParamType::kF32, 1, 25.0F, -1, 64 << 10},
      Variant{"stage 1, parameters homed in the cpu tier, a 24 KiB arena, 2 micro-steps", 1,
              TierKind::kCpu, ParamType::kF16, 2, 0.0F, -1, 4 << 10, TierKind::kCpu, "24KiB"},
      Variant{"stage 2, parameters homed in the cpu tier, a 24 KiB arena, 2 micro-steps", 2,
              TierKind::kCpu, ParamType::kF16, 2, 0.0F, -1, 4 << 10, TierKind::kCpu, "24KiB"},
      Variant{"stage 1 through bounce buffers, fp16, 2 micro-steps, clipped", 1, TierKind::kCpu,
              ParamType::kF16, 2, 0.03F, -1, 8 << 10, TierKind::kGpu, "64MiB", true},
      Variant{"stage 2 through bounce buffers, nvme states, parameters in the cpu tier, a 24 KiB "
              "arena, overflow at step 4",
              2, TierKind::kNvme, ParamType::kF16, 1, 0.0F, 4, 4 << 10, TierKind::kCpu, "24KiB",
              true});
  INFO(v.name << " at " << ranks() << " ranks");
  TempDir dir("strata-zero");
  TempDir ref_dir("strata-zero-ref");
  const ZeroModel model = testing::zero_model();
  ZeroOptions o;
  o.stage = v.stage;
  o.param_type = v.param_type;
  o.grad_type = testing::as_grad_type(v.param_type);
  o.bucket_bytes = v.bucket_bytes;
  o.gradient_buckets = v.bucket_bytes > (32 << 10) ? 1 : 2;
  o.alignment = 8;
  o.accumulation_steps = v.micro_steps;
  o.groups = {AdamGroup{.lr = 1e-2F, .weight_decay = 0.01F},
              AdamGroup{.lr = 3e-3F, .beta1 = 0.8F, .weight_decay = 0.0F}};
  o.optimizer.state_home = v.states;
  o.optimizer.max_grad_norm = v.max_grad_norm;
  if (o.grad_type == GradType::kF16) {
    o.optimizer.loss_scaling = {.scale = 1024.0F, .dynamic = true, .growth_interval = 3};
  }
  const bool nvme = v.states == TierKind::kNvme;
  o.param_home = v.param_home;
  auto runtime = testing::zero_runtime(nvme ? dir.path() : "", v.gpu_bytes);
  REQUIRE(runtime.ok());
  testing::set_zero_bounce_for_testing(v.bounce);
  auto engine = ZeroEngine::create(**runtime, comm(), model.params, o);
  testing::set_zero_bounce_for_testing(false);
  REQUIRE(engine.ok());
  auto reference = ZeroReference::create(model, o, nvme ? ref_dir.path() : "", ranks());
  REQUIRE(reference.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  CHECK((*engine)->layout().groups().size() >= (v.bucket_bytes > (32 << 10) ? 1U : 3U));

  constexpr int kSteps = 12;
  bool clipped = false;
  bool skipped = false;
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    const bool overflow = step == v.overflow_step;
    for (uint32_t micro = 0; micro < v.micro_steps; ++micro) {
      const bool inf = overflow && micro == 0;
      REQUIRE(testing::zero_micro_step(**engine, **stream, model, o.grad_type, step, micro,
                                       my_rank(), inf && my_rank() == ranks() - 1)
                  .ok());
      REQUIRE((*reference)->micro_step(step, micro, ranks(), inf).ok());
    }
    auto got = (*engine)->step();
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    auto want = (*reference)->step();
    REQUIRE(want.ok());
    CHECK(got->skipped == want->skipped);
    CHECK(got->step == want->step);
    CHECK(got->loss_scale == want->loss_scale);
    check_same(got->grad_norm, want->grad_norm, "grad_norm");
    check_same(got->clip_coef, want->clip_coef, "clip_coef");
    clipped = clipped || want->clip_coef < 1.0;
    skipped = skipped || want->skipped;
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      auto mine = testing::zero_param(**engine, **stream, p);
      REQUIRE(mine.ok());
      auto one_rank = (*reference)->param(p);
      REQUIRE(one_rank.ok());
      check_same(*mine, *one_rank, model.params[p].name.c_str());
    }
  }
  CHECK(clipped == (v.max_grad_norm > 0));
  if (v.param_home == TierKind::kCpu) {
    // The arena could not hold the model: tensors were fetched on demand and evicted.
    const StoreStats moved = (*runtime)->store().stats();
    INFO("misses " << moved.misses << ", evictions " << moved.evictions_clean << " clean, "
                   << moved.evictions_writeback << " written back");
    CHECK(moved.misses > 0);
    CHECK(moved.evictions_clean + moved.evictions_writeback > 0);
  }
  CHECK(skipped == (v.overflow_step >= 0));
  // The whole states, gathered from the ranks that own their pieces.
  for (uint32_t p = 0; p < model.params.size(); ++p) {
    const size_t n = model.initial[p].size();
    std::vector<float> master(n), m(n), vv(n), rm(n), rmm(n), rv(n);
    REQUIRE((*engine)->read_state(ZeroParamId{p}, master, m, vv).ok());
    REQUIRE((*reference)->optimizer().read_state((*reference)->id(p), rm, rmm, rv).ok());
    check_same(master, rm, "master");
    check_same(m, rmm, "exp_avg");
    check_same(vv, rv, "exp_avg_sq");
  }
}

// Ψ parameters at K = 12 bytes of optimizer state each (fp32 master and two moments).
TEST_CASE("Model-state bytes and communication follow the ZeRO formulas", "[zero]") {
  const uint32_t stage = GENERATE(1U, 2U);
  INFO("stage " << stage << " at " << ranks() << " ranks");
  const ZeroModel model = testing::zero_model(200);
  ZeroOptions o;
  o.stage = stage;
  o.bucket_bytes = 512 << 10;
  o.gradient_buckets = 2;
  o.groups = {AdamGroup{}, AdamGroup{.lr = 1e-4F}};
  // With an NVMe tier the runtime owns the staging buffers (carved from the CPU tier before
  // `before` is read); without one the optimizer would carve its own after.
  TempDir nvme("strata-zero-mem");
  auto runtime = testing::zero_runtime(nvme.path(), "96MiB", "96MiB");
  REQUIRE(runtime.ok());
  const StoreStats before = (*runtime)->store().stats();
  auto engine = ZeroEngine::create(**runtime, comm(), model.params, o);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  const ZeroLayout& layout = (*engine)->layout();
  const double psi = static_cast<double>(layout.elements());
  const double n = ranks();
  const double padding = static_cast<double>(layout.padded_elements()) - psi;
  INFO("Ψ = " << psi << ", padding " << padding << " elements");

  // What the store holds for the engine, by tier (it holds nothing else), copies that are on
  // their way out gone.
  REQUIRE((*runtime)->store().flush().ok());
  const StoreStats after = (*runtime)->store().stats();
  const ZeroMemory memory = (*engine)->memory();
  const size_t gpu = static_cast<size_t>(TierKind::kGpu);
  const size_t cpu = static_cast<size_t>(TierKind::kCpu);
  const double used_gpu = static_cast<double>(after.tiers[gpu].used - before.tiers[gpu].used);
  const double used_cpu = static_cast<double>(after.tiers[cpu].used - before.tiers[cpu].used);
  const double buckets = static_cast<double>(memory.buckets[gpu]);
  const double model_states = used_gpu + used_cpu - buckets;
  const double formula = stage == 1 ? 4 * psi + 12 * psi / n : 2 * psi + 14 * psi / n;
  INFO("drops pending " << after.drops_pending << ", moves in flight " << after.moves_in_flight
                        << ", resident in cpu " << after.tiers[cpu].resident);
  INFO("store: gpu " << used_gpu << " cpu " << used_cpu << " buckets " << buckets
                     << "; model states " << model_states << ", formula " << formula);
  // The figures docs/zero.md quotes.
  if (my_rank() == 0) {
    std::printf(
        "zero memory: %u ranks, stage %u, psi %.0f, formula %.0f, store %.0f (gpu %.0f, "
        "cpu %.0f, buckets %.0f)\n",
        ranks(), stage, psi, formula, model_states, used_gpu, used_cpu, buckets);
  }
  CHECK(std::fabs(model_states - formula) <= 0.05 * formula + 18 * padding);
  // The engine's own account agrees with the store's (the arena rounds blocks up a little).
  CHECK(std::fabs(static_cast<double>(memory.model_states()) - model_states) <=
        0.01 * model_states);
  if (stage == 2) {
    CHECK(memory.grads[gpu] == 0);  // no full-size gradient anywhere
    CHECK(memory.grads[cpu] == layout.shard_elements() * 2);
    uint64_t largest = 0;
    for (const ZeroFlatGroup& g : layout.groups()) largest = std::max(largest, g.padded);
    CHECK(memory.buckets[gpu] == o.gradient_buckets * largest * 2);
  } else {
    CHECK(memory.grads[gpu] == layout.padded_elements() * 2);
  }
  CHECK(memory.optimizer_states[cpu] == layout.shard_elements() * 12);

  // Two steps; the second one's bytes: a reduce-scatter and an all-gather of every group (2Ψ
  // fp16 elements, 4Ψ bytes) and the 16-byte all-reduce of the gradient statistics.
  for (int step = 0; step < 2; ++step) {
    const CommStats c0 = comm().stats();
    REQUIRE(
        testing::zero_micro_step(**engine, **stream, model, o.grad_type, step, 0, my_rank(), false)
            .ok());
    auto result = (*engine)->step();
    REQUIRE(result.ok());
    const CommStats c1 = comm().stats();
    const uint64_t rs =
        c1[CollectiveKind::kReduceScatter].bytes - c0[CollectiveKind::kReduceScatter].bytes;
    const uint64_t ag = c1[CollectiveKind::kAllGather].bytes - c0[CollectiveKind::kAllGather].bytes;
    const uint64_t ar = c1[CollectiveKind::kAllReduce].bytes - c0[CollectiveKind::kAllReduce].bytes;
    CHECK(rs == layout.padded_elements() * 2);
    CHECK(ag == layout.padded_elements() * 2);
    CHECK(ar == 16);
    const double elements = static_cast<double>(rs + ag) / 2;
    CHECK(std::fabs(elements - 2 * psi) <= 0.01 * 2 * psi + 2 * padding);
    // Reduce-scatters issued during the step's backward count toward it too.
    CHECK((*engine)->stats().last_step_comm_bytes == rs + ag + ar);
    const uint64_t wire = c1.total_wire_bytes() - c0.total_wire_bytes();
    CHECK(static_cast<double>(wire) >= static_cast<double>(rs + ag) * (n - 1) / n);
  }
}

TEST_CASE("A checkpoint of another model is refused by every rank", "[zero]") {
  TempDir dir("strata-zero-ckpt");
  // The checkpoint directory must be the same for every rank: rank 0's, broadcast.
  std::vector<char> path(256, 0);
  if (my_rank() == 0) std::snprintf(path.data(), path.size(), "%s", dir.path().c_str());
  auto work = comm().broadcast(path.data(), path.size(), DataType::kUInt8, 0);
  REQUIRE(work.ok());
  REQUIRE((*work)->wait().ok());
  const std::string shared = std::string(path.data()) + "/ckpt";

  ZeroModel model = testing::zero_model();
  ZeroOptions o;
  o.bucket_bytes = 8 << 10;
  o.alignment = 4;
  o.groups = {AdamGroup{}, AdamGroup{.lr = 1e-4F}};
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  {
    auto engine = ZeroEngine::create(**runtime, comm(), model.params, o);
    REQUIRE(engine.ok());
    auto saved = (*engine)->save(shared);
    INFO(saved.ToString());
    REQUIRE(saved.ok());
  }
  ZeroModel other = testing::zero_model();
  other.params[4].shape = {17, 129};  // the same size, another shape
  auto engine = ZeroEngine::create(**runtime, comm(), other.params, o);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  auto loaded = (*engine)->load(shared);
  INFO(loaded.ToString());
  CHECK(loaded.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(loaded.message().find("not of this model") != absl::string_view::npos);
  CHECK(loaded.message().find("block1.mlp") != absl::string_view::npos);
  // The engine still works after a refused load.
  CHECK((*engine)->zero_grad().ok());
}

}  // namespace
}  // namespace strata
