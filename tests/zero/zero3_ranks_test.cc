// ZeRO-DP stage 3, run by every rank of a job (under strata-run with 2, 3 and 4 ranks, Gloo, with
// zero_ranks_test.cc). Each rank trains the one-rank reference (zero_rig.h) beside the engine
// and checks, every step: every gathered parameter it reads in forward and backward equals the
// reference's bit for bit, the step results are the same, the gathered bytes stayed under the
// configured maximum; then the model-state bytes of (4+K)Ψ/N, 3Ψ of communication per step, and
// each rank's NVMe reads equal to its own shard.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
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

Communicator& comm3() { return testing::job_communicator(); }

uint32_t ranks() { return static_cast<uint32_t>(comm3().size()); }
uint32_t my_rank() { return static_cast<uint32_t>(comm3().rank()); }

uint64_t differing(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return UINT64_MAX;
  uint64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += got[i] != want[i] ? 1 : 0;
  return n;
}

// One training step of a stage-3 trainer over the rig's model: forward reads every parameter in
// `forward` order; backward reads them in reverse and adds each gradient while its parameter is
// held (as autograd does). Every value read is compared with the one-rank reference's.
struct Stage3Step {
  ZeroEngine& engine;
  Stream& stream;
  const ZeroModel& model;
  ZeroReference& reference;
  uint64_t mismatched = 0;  // values read that differed from the reference
  uint64_t peak_seen = 0;   // the engine's gathered bytes, read at every use

  absl::Status read(uint32_t p) {
    auto mine = testing::zero_param(engine, stream, p);
    if (!mine.ok()) return mine.status();
    auto want = reference.param(p);
    if (!want.ok()) return want.status();
    mismatched += differing(*mine, *want);
    peak_seen = std::max(peak_seen, engine.stats().gathered_bytes);
    return absl::OkStatus();
  }

  absl::Status run(const std::vector<uint32_t>& forward, uint64_t step, uint32_t micro_steps,
                   bool overflow) {
    const GradType type = engine.options().grad_type;
    Device& device = engine.runtime().device();
    for (uint32_t micro = 0; micro < micro_steps; ++micro) {
      for (uint32_t p : forward) {
        if (auto st = read(p); !st.ok()) return st;
      }
      for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
        const uint32_t p = *it;
        const ZeroParamId id{p};
        // Held across its gradient, as a module's weight is during its backward.
        auto held = engine.acquire_param(id, TierKind::kGpu, stream);
        if (!held.ok()) return held.status();
        auto buffer = engine.acquire_grad(id, TierKind::kGpu, stream);
        if (!buffer.ok()) return buffer.status();
        if (auto st = device.synchronize(stream); !st.ok()) return st;
        auto want = reference.param(p);
        if (!want.ok()) return want.status();
        for (uint64_t i = 0; i < want->size(); ++i) {
          const float got =
              testing::load_value(*held, testing::as_grad_type(engine.options().param_type), i);
          mismatched += got != (*want)[i] ? 1 : 0;
        }
        for (uint64_t i = 0; i < model.initial[p].size(); ++i) {
          const float add = testing::synthetic_grad(step, micro, my_rank(), p, i);
          testing::store_value(*buffer, type, i, testing::load_value(*buffer, type, i) + add);
        }
        if (overflow && micro == 0 && p == 2 && my_rank() == ranks() - 1) {
          testing::store_value(*buffer, type, 5, INFINITY);
        }
        if (auto st = engine.grad_ready(id, stream); !st.ok()) return st;
        if (auto st = engine.release_param(id, stream); !st.ok()) return st;
        peak_seen = std::max(peak_seen, engine.stats().gathered_bytes);
      }
      if (auto st = reference.micro_step(step, micro, ranks(), overflow && micro == 0); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
};

struct Variant3 {
  const char* name;
  TierKind shard_home;
  TierKind states;
  ParamType param_type;
  uint32_t micro_steps;
  float max_grad_norm;
  int64_t overflow_step;
  uint64_t prefetch_bytes;
  uint64_t max_live_bytes;
  uint64_t reuse_window_bytes;
  uint64_t persist_below_bytes = 128;  // the norms and the bias stay whole
  int64_t reorder_step = -1;           // from this step on, forward uses another order
  // Gloo's data through pinned bounce buffers, as on a CUDA device (zero_testing.h).
  bool bounce = false;
};

TEST_CASE("ZeRO stage 3 trains as one rank does, shards in every tier", "[zero3]") {
  const Variant3 v = GENERATE(
      Variant3{"shards in the gpu tier, fp16, clipped, overflow at step 3", TierKind::kGpu,
               TierKind::kCpu, ParamType::kF16, 1, 0.02F, 3, 16 << 10, 64 << 10, 64 << 10},
      Variant3{"shards in the cpu tier, fp32, 2 micro-steps, nothing kept", TierKind::kCpu,
               TierKind::kCpu, ParamType::kF32, 2, 0.0F, -1, 8 << 10, 48 << 10, 0},
      Variant3{"shards on nvme, nvme states, fp16, 2 micro-steps, clipped", TierKind::kNvme,
               TierKind::kNvme, ParamType::kF16, 2, 0.03F, -1, 32 << 10, 1 << 20, 1 << 20},
      Variant3{"shards on nvme, a live limit of the largest group: every use drops another",
               TierKind::kNvme, TierKind::kCpu, ParamType::kF16, 1, 0.0F, -1, 64 << 10, 0, 0},
      Variant3{"shards in the cpu tier, no persistent parameters, order changed at step 4",
               TierKind::kCpu, TierKind::kCpu, ParamType::kF16, 1, 0.0F, 6, 16 << 10, 64 << 10,
               64 << 10, 0, 4},
      Variant3{"through bounce buffers, shards in the cpu tier, fp16, 2 micro-steps, clipped, a "
               "live limit of the largest group",
               TierKind::kCpu, TierKind::kCpu, ParamType::kF16, 2, 0.03F, -1, 16 << 10, 0, 0, 128,
               -1, true});
  INFO(v.name << " at " << ranks() << " ranks");
  TempDir dir("strata-zero3");
  TempDir ref_dir("strata-zero3-ref");
  const ZeroModel model = testing::zero_model();
  ZeroOptions o;
  o.stage = 3;
  o.param_type = v.param_type;
  o.grad_type = testing::as_grad_type(v.param_type);
  o.bucket_bytes = 8 << 10;
  o.alignment = 8;
  o.accumulation_steps = v.micro_steps;
  o.param_home = v.shard_home;
  o.prefetch_bytes = v.prefetch_bytes;
  o.reuse_window_bytes = v.reuse_window_bytes;
  o.persist_below_bytes = v.persist_below_bytes;
  o.groups = {AdamGroup{.lr = 1e-2F, .weight_decay = 0.01F},
              AdamGroup{.lr = 3e-3F, .beta1 = 0.8F, .weight_decay = 0.0F}};
  o.optimizer.state_home = v.states;
  o.optimizer.max_grad_norm = v.max_grad_norm;
  if (o.grad_type == GradType::kF16) {
    o.optimizer.loss_scaling = {.scale = 1024.0F, .dynamic = true, .growth_interval = 3};
  }
  // A live limit of 0 in the variant: the largest group's gathered bytes, the least that works.
  {
    ZeroOptions probe = o;
    probe.max_live_bytes = UINT64_MAX;
    probe.param_home = TierKind::kCpu;  // the layout does not depend on where things live
    probe.optimizer.state_home = TierKind::kCpu;
    auto runtime = testing::zero_runtime("");
    REQUIRE(runtime.ok());
    auto engine = ZeroEngine::create(**runtime, comm3(), model.params, probe);
    REQUIRE(engine.ok());
    uint64_t largest = 0;
    for (const ZeroFlatGroup& g : (*engine)->layout().groups()) {
      if (!g.persistent)
        largest = std::max(largest, g.padded * (o.param_type == ParamType::kF32 ? 4U : 2U));
    }
    o.max_live_bytes = v.max_live_bytes == 0 ? largest : v.max_live_bytes;
  }
  const bool nvme = v.shard_home == TierKind::kNvme || v.states == TierKind::kNvme;
  auto runtime = testing::zero_runtime(nvme ? dir.path() : "");
  REQUIRE(runtime.ok());
  testing::set_zero_bounce_for_testing(v.bounce);
  auto engine = ZeroEngine::create(**runtime, comm3(), model.params, o);
  testing::set_zero_bounce_for_testing(false);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  auto reference =
      ZeroReference::create(model, o, v.states == TierKind::kNvme ? ref_dir.path() : "", ranks());
  REQUIRE(reference.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  const ZeroLayout& layout = (*engine)->layout();
  uint32_t persistent = 0;
  for (const ZeroFlatGroup& g : layout.groups()) persistent += g.persistent ? 1 : 0;
  CHECK((persistent > 0) == (v.persist_below_bytes > 0));
  CHECK(layout.groups().size() - persistent >= 3);

  std::vector<uint32_t> forward;
  for (uint32_t p = 0; p < model.params.size(); ++p) forward.push_back(p);
  // Another path through the model: block1 before block0. The engine first skips ahead in the
  // recorded order (to block1.mlp), then meets block0, behind it, and fetches on demand.
  const std::vector<uint32_t> reordered = {0, 4, 6, 1, 2, 3, 5};

  Stage3Step trainer{**engine, **stream, model, **reference};
  constexpr int kSteps = 8;
  bool skipped = false;
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    const bool reorder = v.reorder_step >= 0 && step >= v.reorder_step;
    auto ran = trainer.run(reorder ? reordered : forward, static_cast<uint64_t>(step),
                           v.micro_steps, step == v.overflow_step);
    INFO(ran.ToString());
    REQUIRE(ran.ok());
    auto got = (*engine)->step();
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    auto want = (*reference)->step();
    REQUIRE(want.ok());
    CHECK(got->skipped == want->skipped);
    CHECK(got->loss_scale == want->loss_scale);
    CHECK(got->grad_norm == want->grad_norm);
    CHECK(got->clip_coef == want->clip_coef);
    skipped = skipped || got->skipped;
    CHECK(trainer.mismatched == 0);
    const ZeroStats stats = (*engine)->stats();
    CHECK(stats.gathered_peak_bytes <= o.max_live_bytes);
    CHECK(trainer.peak_seen <= o.max_live_bytes);
  }
  CHECK(skipped == (v.overflow_step >= 0 && v.overflow_step < kSteps));
  const ZeroStats stats = (*engine)->stats();
  INFO("fetches " << stats.fetches << ", on demand " << stats.gathers_on_demand << ", prefetched "
                  << stats.gathers_prefetched << ", reuses " << stats.reuses << ", dropped unused "
                  << stats.gathers_dropped_unused << ", order changes " << stats.order_changes);
  CHECK(stats.gathers_prefetched > 0);
  if (v.reuse_window_bytes == 0) CHECK(stats.reuses == 0);
  if (v.reuse_window_bytes > 0) CHECK(stats.reuses > 0);
  CHECK((stats.order_changes > 0) == (v.reorder_step >= 0));
  // Nothing stays gathered across a step.
  CHECK((*engine)->memory().gathered == stats.gathered_bytes);
  for (uint32_t p = 0; p < model.params.size(); ++p) {
    const size_t n = model.initial[p].size();
    std::vector<float> master(n), m(n), vv(n), rm(n), rmm(n), rv(n);
    REQUIRE((*engine)->read_state(ZeroParamId{p}, master, m, vv).ok());
    REQUIRE((*reference)->optimizer().read_state((*reference)->id(p), rm, rmm, rv).ok());
    CHECK(differing(master, rm) == 0);
    CHECK(differing(m, rmm) == 0);
    CHECK(differing(vv, rv) == 0);
  }
}

// One step of a trainer that does not check values: forward then backward over every parameter.
absl::Status plain_step(ZeroEngine& engine, Stream& stream, const ZeroModel& model, uint64_t step) {
  const uint32_t n = static_cast<uint32_t>(model.params.size());
  for (uint32_t p = 0; p < n; ++p) {
    if (auto got = engine.acquire_param(ZeroParamId{p}, TierKind::kGpu, stream); !got.ok()) {
      return got.status();
    }
    if (auto st = engine.release_param(ZeroParamId{p}, stream); !st.ok()) return st;
  }
  for (uint32_t p = n; p-- > 0;) {
    const ZeroParamId id{p};
    if (auto got = engine.acquire_param(id, TierKind::kGpu, stream); !got.ok()) {
      return got.status();
    }
    auto buffer = engine.acquire_grad(id, TierKind::kGpu, stream);
    if (!buffer.ok()) return buffer.status();
    if (auto st = engine.runtime().device().synchronize(stream); !st.ok()) return st;
    for (uint64_t i = 0; i < model.initial[p].size(); ++i) {
      testing::store_value(*buffer, engine.options().grad_type, i,
                           testing::synthetic_grad(step, 0, my_rank(), p, i));
    }
    if (auto st = engine.grad_ready(id, stream); !st.ok()) return st;
    if (auto st = engine.release_param(id, stream); !st.ok()) return st;
  }
  return engine.step().status();
}

// Ψ parameters, K = 12 bytes of optimizer state each; Ψs of them persistent (whole everywhere).
TEST_CASE("Stage 3: (4+K)Ψ/N model-state bytes, 3Ψ per step, NVMe reads of the own shard",
          "[zero3]") {
  const TierKind home = GENERATE(TierKind::kCpu, TierKind::kNvme);
  INFO("shards homed in " << to_string(home) << " at " << ranks() << " ranks");
  const ZeroModel model = testing::zero_model(200);
  ZeroOptions o;
  o.stage = 3;
  o.bucket_bytes = 512 << 10;
  o.param_home = home;
  o.persist_below_bytes = 128;  // the norms and the bias
  o.reuse_window_bytes = 0;     // every use gathers: exactly two all-gathers per group
  o.prefetch_bytes = 1 << 20;
  o.max_live_bytes = 8 << 20;
  o.groups = {AdamGroup{}, AdamGroup{.lr = 1e-4F}};
  TempDir nvme("strata-zero3-mem");
  auto runtime = testing::zero_runtime(nvme.path(), "96MiB", "96MiB");
  REQUIRE(runtime.ok());
  const StoreStats before = (*runtime)->store().stats();
  auto engine = ZeroEngine::create(**runtime, comm3(), model.params, o);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  const ZeroLayout& layout = (*engine)->layout();
  const double n = ranks();
  double psi = 0, psi_persistent = 0, padded = 0, padded_partitioned = 0, padded_persistent = 0;
  uint64_t own_shard_bytes = 0;
  for (const ZeroFlatGroup& g : layout.groups()) {
    psi += static_cast<double>(g.elements);
    padded += static_cast<double>(g.padded);
    if (g.persistent) {
      psi_persistent += static_cast<double>(g.elements);
      padded_persistent += static_cast<double>(g.padded);
    } else {
      padded_partitioned += static_cast<double>(g.padded);
      own_shard_bytes += g.shard * 2;
    }
  }
  const double padding = padded - psi;
  REQUIRE(psi_persistent == 33 + 1 + 17);
  INFO("Ψ = " << psi << " (" << psi_persistent << " persistent), padding " << padding);

  REQUIRE((*runtime)->store().flush().ok());
  const StoreStats after = (*runtime)->store().stats();
  const ZeroMemory memory = (*engine)->memory();
  double used = 0;
  for (size_t t = 0; t < 3; ++t) {
    used += static_cast<double>(after.tiers[t].used - before.tiers[t].used);
  }
  double buckets = 0;
  for (uint64_t b : memory.buckets) buckets += static_cast<double>(b);
  const double model_states = used - buckets;
  const double psi_partitioned = psi - psi_persistent;
  const double formula = 16 * psi_partitioned / n + 2 * psi_persistent + 14 * psi_persistent / n;
  if (my_rank() == 0) {
    std::printf(
        "zero memory: %u ranks, stage 3 (shards in %s), psi %.0f, formula %.0f, store %.0f\n",
        ranks(), std::string(to_string(home)).c_str(), psi, formula, model_states);
  }
  INFO("store " << model_states << ", formula " << formula << ", engine " << memory.model_states()
                << "; gpu " << after.tiers[0].used - before.tiers[0].used << " cpu "
                << after.tiers[1].used - before.tiers[1].used << " nvme "
                << after.tiers[2].used - before.tiers[2].used << "; drops pending "
                << after.drops_pending << "; engine params " << memory.params[0] << "/"
                << memory.params[1] << "/" << memory.params[2] << " grads " << memory.grads[1]
                << " states " << memory.optimizer_states[1] << " buckets " << buckets);
  CHECK(std::fabs(model_states - formula) <= 0.05 * formula + 18 * padding);
  // The engine's account agrees with the store's but for the arena's block rounding of each of
  // the engine's tensors (5 per group: shard, gradient shard, master, two moments).
  CHECK(std::fabs(static_cast<double>(memory.model_states()) - model_states) <=
        0.01 * model_states + 4096.0 * 5 * static_cast<double>(layout.groups().size()));
  CHECK(memory.params[static_cast<size_t>(home)] >= own_shard_bytes);
  CHECK(memory.gathered == 0);

  // Step 0 records the order; from its end on, each step's bytes include the next step's
  // first gathers (prefetched as the step ends) instead of its own: the same in steady state.
  REQUIRE(plain_step(**engine, **stream, model, 0).ok());
  for (uint64_t step = 1; step < 4; ++step) {
    INFO("step " << step);
    const CommStats c0 = comm3().stats();
    const StoreStats s0 = (*runtime)->store().stats();
    auto ran = plain_step(**engine, **stream, model, step);
    INFO(ran.ToString());
    REQUIRE(ran.ok());
    const CommStats c1 = comm3().stats();
    const StoreStats s1 = (*runtime)->store().stats();
    const uint64_t rs =
        c1[CollectiveKind::kReduceScatter].bytes - c0[CollectiveKind::kReduceScatter].bytes;
    const uint64_t ag = c1[CollectiveKind::kAllGather].bytes - c0[CollectiveKind::kAllGather].bytes;
    CHECK(static_cast<double>(rs) == padded * 2);
    // Forward and backward gathers of the partitioned groups, and the persistent groups' gather
    // after the step.
    CHECK(static_cast<double>(ag) == (2 * padded_partitioned + padded_persistent) * 2);
    const double elements = static_cast<double>(rs + ag) / 2;
    CHECK(std::fabs(elements - 3 * psi) <= 0.01 * 3 * psi + 3 * padding);
    CHECK((*engine)->stats().gathered_peak_bytes <= o.max_live_bytes);
    if (home == TierKind::kNvme) {
      // ZeRO-Infinity: each rank reads its own shard (1/N of the model) from its drive, once.
      uint64_t read = 0;
      for (size_t to = 0; to < 3; ++to) {
        read += s1.moves[static_cast<size_t>(TierKind::kNvme)][to].bytes -
                s0.moves[static_cast<size_t>(TierKind::kNvme)][to].bytes;
      }
      INFO("nvme read " << read << " bytes, own shard " << own_shard_bytes);
      CHECK(read == own_shard_bytes);
    }
  }
}

// hpZ (ZeroOptions::hpz_node_ranks): at 4 ranks, 2 nodes × 2 (LOCAL_WORLD_SIZE=2's split); at 2
// and 3, nodes of one rank (each keeps the whole group as its secondary). Engines with and
// without hpZ train side by side on randomized layouts: every value read and every state equal
// the one-rank reference's, bitwise, so each other's; from the second step on (the first has no
// recorded order yet) each step's gathered bytes follow the formulas: without hpZ every use
// gathers over every rank, with it only the step's first gather of each group does and the
// rest stay inside the node, the node communicator's statistics counting them; and the
// secondary costs padded/L per group.
// Shards in the GPU, CPU and NVMe tiers, the last through bounce buffers.
TEST_CASE("Stage 3 with hpZ: bitwise the same as without, backward's gathers inside the node",
          "[zero3][hpz]") {
  const uint32_t n = ranks();
  const uint32_t node = n % 2 == 0 && n > 2 ? 2 : 1;
  std::mt19937_64 rng(20261126);
  const ZeroModel model = testing::zero_model();
  for (int trial = 0; trial < 4; ++trial) {
    ZeroOptions o;
    o.stage = 3;
    o.param_type = trial == 1 ? ParamType::kF32 : ParamType::kF16;
    o.grad_type = testing::as_grad_type(o.param_type);
    o.bucket_bytes = (2 + rng() % 9) << 10;
    o.alignment = static_cast<uint32_t>(1 + rng() % 8);
    // Trial 2: shards (and the secondary slices) in the CPU tier; 3: on NVMe, through bounce
    // buffers (zero_testing.h) as Gloo on a CUDA device.
    o.param_home = trial == 2 ? TierKind::kCpu : trial == 3 ? TierKind::kNvme : TierKind::kGpu;
    const bool bounce = trial == 3;
    o.persist_below_bytes = 128;
    o.prefetch_bytes = (4 + rng() % 16) << 10;
    o.reuse_window_bytes = 0;  // every use gathers: two gathers per group and step
    o.max_live_bytes = 1 << 20;
    o.accumulation_steps = trial == 2 ? 2 : 1;
    o.groups = {AdamGroup{.lr = 1e-2F, .weight_decay = 0.01F},
                AdamGroup{.lr = 3e-3F, .beta1 = 0.8F, .weight_decay = 0.0F}};
    o.optimizer.state_home = TierKind::kCpu;
    ZeroOptions h = o;
    h.hpz_node_ranks = node;
    INFO("trial " << trial << " at " << n << " ranks, nodes of " << node << ", bucket_bytes "
                  << o.bucket_bytes << ", alignment " << o.alignment);
    TempDir nvme_a("strata-hpz-a"), nvme_b("strata-hpz-b");
    auto runtime_a = testing::zero_runtime(bounce ? nvme_a.path() : "");
    auto runtime_b = testing::zero_runtime(bounce ? nvme_b.path() : "");
    REQUIRE(runtime_a.ok());
    REQUIRE(runtime_b.ok());
    testing::set_zero_bounce_for_testing(bounce);
    auto plain = ZeroEngine::create(**runtime_a, comm3(), model.params, o);
    auto hpz = ZeroEngine::create(**runtime_b, comm3(), model.params, h);
    testing::set_zero_bounce_for_testing(false);
    REQUIRE(plain.ok());
    INFO(hpz.status().ToString());
    REQUIRE(hpz.ok());
    Communicator* node_comm = (*hpz)->node_communicator();
    REQUIRE(node_comm != nullptr);
    CHECK(node_comm->size() == static_cast<int>(node));
    CHECK(node_comm->rank() == static_cast<int>(my_rank() % node));
    CHECK((*plain)->node_communicator() == nullptr);
    auto ref_a = ZeroReference::create(model, o, "", n);
    auto ref_b = ZeroReference::create(model, h, "", n);
    REQUIRE(ref_a.ok());
    REQUIRE(ref_b.ok());
    auto stream_a = (*runtime_a)->device().create_stream();
    auto stream_b = (*runtime_b)->device().create_stream();
    REQUIRE(stream_a.ok());
    REQUIRE(stream_b.ok());
    const ZeroLayout& layout = (*hpz)->layout();
    const uint64_t element = o.param_type == ParamType::kF32 ? 4 : 2;
    uint64_t sigma = 0, secondary = 0;  // gathered bytes of every partitioned group, its slices
    for (const ZeroFlatGroup& g : layout.groups()) {
      if (g.persistent) continue;
      sigma += g.padded * element;
      secondary += g.padded / node * element;
    }
    REQUIRE(sigma > 0);
    // This trainer acquires parameter by parameter and nothing is kept (reuse window 0): every
    // acquire of a partitioned parameter gathers its group, twice per micro-step.
    uint64_t per_pass = 0;
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      const ZeroFlatGroup& g = layout.groups()[layout.param_segment(p).group];
      if (!g.persistent) per_pass += g.padded * element;
    }
    const auto params_total = [](const ZeroMemory& m) {
      return m.params[0] + m.params[1] + m.params[2];
    };
    CHECK(params_total((*hpz)->memory()) - params_total((*plain)->memory()) == secondary);

    std::vector<uint32_t> forward;
    for (uint32_t p = 0; p < model.params.size(); ++p) forward.push_back(p);
    Stage3Step trainer_a{**plain, **stream_a, model, **ref_a};
    Stage3Step trainer_b{**hpz, **stream_b, model, **ref_b};
    ZeroStats before_a = (*plain)->stats(), before_b = (*hpz)->stats();
    uint64_t node_before = node_comm->stats()[CollectiveKind::kAllGather].bytes;
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      REQUIRE(
          trainer_a.run(forward, static_cast<uint64_t>(step), o.accumulation_steps, false).ok());
      REQUIRE(
          trainer_b.run(forward, static_cast<uint64_t>(step), o.accumulation_steps, false).ok());
      auto got_a = (*plain)->step();
      auto got_b = (*hpz)->step();
      REQUIRE(got_a.ok());
      REQUIRE(got_b.ok());
      REQUIRE((*ref_a)->step().ok());
      REQUIRE((*ref_b)->step().ok());
      CHECK(got_a->grad_norm == got_b->grad_norm);
      CHECK(got_a->loss_scale == got_b->loss_scale);
      CHECK(got_a->skipped == got_b->skipped);
      CHECK(trainer_a.mismatched == 0);
      CHECK(trainer_b.mismatched == 0);
      const ZeroStats a = (*plain)->stats(), b = (*hpz)->stats();
      const uint64_t node_now = node_comm->stats()[CollectiveKind::kAllGather].bytes;
      CHECK(b.node_gather_bytes - before_b.node_gather_bytes == node_now - node_before);
      if (step > 0) {
        // Without hpZ every gather is global; with it only the step's first gather of each
        // group is, the others stay inside the node.
        const uint64_t a_global = a.global_gather_bytes - before_a.global_gather_bytes;
        CHECK(a_global == 2 * o.accumulation_steps * per_pass);
        CHECK(a.node_gather_bytes == 0);
        CHECK(b.global_gather_bytes - before_b.global_gather_bytes == sigma);
        CHECK(b.node_gather_bytes - before_b.node_gather_bytes ==
              2 * o.accumulation_steps * per_pass - sigma);
      }
      CHECK(a.gathers_dropped_unused == 0);
      CHECK(b.gathers_dropped_unused == 0);
      before_a = a;
      before_b = b;
      node_before = node_now;
    }
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      const size_t count = model.initial[p].size();
      std::vector<float> ma(count), va(count), sa(count), mb(count), vb(count), sb(count);
      REQUIRE((*plain)->read_state(ZeroParamId{p}, ma, va, sa).ok());
      REQUIRE((*hpz)->read_state(ZeroParamId{p}, mb, vb, sb).ok());
      CHECK(differing(ma, mb) == 0);
      CHECK(differing(va, vb) == 0);
      CHECK(differing(sa, sb) == 0);
    }
  }
}

}  // namespace
}  // namespace strata
