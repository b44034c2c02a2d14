// ZeRO-DP in one process: the layout, a job of one rank (equal to the plain optimizer bit for
// bit), every misuse as a precise error (never a hang), damaged checkpoints, and the failure
// scenario as real processes: a rank killed mid-step turns into the Communicator's error on the
// others, and the last checkpoint still loads in a new job.
#include <absl/strings/match.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "comm/rank_processes.h"
#include "config/log_capture.h"
#include "strata/zero/zero_engine.h"
#include "temp_dir.h"
#include "zero/zero_rig.h"

namespace strata {
namespace {

using testing::TempDir;

std::vector<ZeroLayoutParam> layout_params(const std::vector<uint64_t>& counts,
                                           const std::vector<uint32_t>& groups = {}) {
  std::vector<ZeroLayoutParam> out;
  for (size_t i = 0; i < counts.size(); ++i) {
    out.push_back(ZeroLayoutParam{"p" + std::to_string(i),
                                  {static_cast<int64_t>(counts[i])},
                                  0,
                                  groups.empty() ? 0 : groups[i]});
  }
  return out;
}

TEST_CASE("ZeroLayout packs whole parameters and pads every group to ranks x alignment",
          "[zero][layout]") {
  // 3 ranks, alignment 4: quantum 12; groups of at most 100 elements (rounded down to 96).
  auto layout = ZeroLayout::plan(layout_params({50, 30, 20, 200, 7, 1}), 3, 100, 4);
  REQUIRE(layout.ok());
  const auto& g = layout->groups();
  REQUIRE(g.size() == 4);
  CHECK(g[0].elements == 80);  // 50 + 30; 20 more would exceed 96
  CHECK(g[0].padded == 84);
  CHECK(g[0].shard == 28);
  CHECK(g[1].elements == 20);
  CHECK(g[2].elements == 200);  // larger than a group: alone
  CHECK(g[2].padded == 204);
  CHECK(g[3].elements == 8);  // 7 + 1
  CHECK(g[3].segment_count == 2);
  CHECK(layout->elements() == 308);
  // Every parameter is one segment, in one group; every group's padding is below a quantum.
  for (uint32_t p = 0; p < 6; ++p)
    CHECK(layout->param_segment(p).count == layout->params()[p].count);
  for (const ZeroFlatGroup& fg : g) {
    CHECK(fg.padded % 12 == 0);
    CHECK(fg.padded - fg.elements < 12);
    CHECK(fg.shard * 3 == fg.padded);
  }
  // The ranks' slices cover every element of a group exactly once.
  for (uint32_t group = 0; group < g.size(); ++group) {
    uint64_t covered = 0;
    for (uint32_t r = 0; r < 3; ++r) {
      for (const ZeroSegment& s : layout->slice_segments(group, r)) {
        CHECK(s.group_offset >= r * g[group].shard);
        CHECK(s.group_offset + s.count <= (r + 1) * g[group].shard);
        covered += s.count;
      }
    }
    CHECK(covered == g[group].elements);
  }
}

TEST_CASE("ZeroLayout keeps hyper-parameter groups apart and a large parameter alone",
          "[zero][layout]") {
  auto layout = ZeroLayout::plan(layout_params({10, 10, 10, 500, 10}, {0, 0, 1, 1, 1}), 2, 64, 8);
  REQUIRE(layout.ok());
  const auto& g = layout->groups();
  REQUIRE(g.size() == 4);
  CHECK(g[0].adam_group == 0);
  CHECK(g[0].segment_count == 2);
  CHECK(g[1].adam_group == 1);
  CHECK(g[1].segment_count == 1);  // p2; p3 is larger than a group
  CHECK(g[2].elements == 500);
  CHECK(g[2].padded == 512);
  CHECK(g[3].segment_count == 1);
}

TEST_CASE("ZeroLayout packs stage 3's persistent parameters apart, in order", "[zero][layout]") {
  // Weights and biases alternate, as in a model; the biases are persistent.
  auto params = layout_params({40, 4, 40, 4, 40, 4});
  for (size_t i = 1; i < params.size(); i += 2) params[i].persistent = true;
  auto layout = ZeroLayout::plan(params, 2, 96, 4);
  REQUIRE(layout.ok());
  const auto& g = layout->groups();
  REQUIRE(g.size() == 3);
  CHECK_FALSE(g[0].persistent);
  CHECK(g[0].segment_count == 2);  // w0, w2: the biases between do not close it
  CHECK(g[1].persistent);
  CHECK(g[1].segment_count == 3);  // b0, b1, b2
  CHECK(g[1].elements == 12);
  CHECK_FALSE(g[2].persistent);  // w4: 40 + 80 > 96
  // Segments by parameter and by group agree.
  for (uint32_t p = 0; p < 6; ++p) {
    const ZeroSegment& seg = layout->param_segment(p);
    CHECK(seg.param == p);
    CHECK(g[seg.group].persistent == params[p].persistent);
    bool found = false;
    for (const ZeroSegment& in_group : layout->group_segments(seg.group)) {
      found = found || (in_group.param == p && in_group.group_offset == seg.group_offset);
    }
    CHECK(found);
  }
  CHECK(layout->group_segments(1)[1].param == 3);
  CHECK(layout->group_segments(1)[1].group_offset == 4);
  // Without persistent parameters the packing is the one before the flag existed.
  auto plain = ZeroLayout::plan(layout_params({40, 4, 40, 4, 40, 4}), 2, 96, 4);
  REQUIRE(plain.ok());
  CHECK(plain->groups().size() == 2);
  CHECK(plain->groups()[0].segment_count == 4);
}

TEST_CASE("ZeroLayout rejects bad input with the reason", "[zero][layout]") {
  auto dup = ZeroLayout::plan({{"w", {4}, 0, 0}, {"w", {4}, 0, 0}}, 2, 64, 8);
  CHECK(absl::StrContains(dup.status().message(), "two parameters are named 'w'"));
  auto dim = ZeroLayout::plan({{"w", {4, 0}, 0, 0}}, 2, 64, 8);
  CHECK(absl::StrContains(dim.status().message(), "dimension 0"));
  auto small = ZeroLayout::plan({{"w", {4}, 0, 0}}, 4, 16, 8);
  CHECK(absl::StrContains(small.status().message(), "raise the bucket size"));
  auto empty = ZeroLayout::plan({}, 2, 64, 8);
  CHECK(absl::StrContains(empty.status().message(), "no parameters"));
}

// A job of one rank: the process alone, no launch variables.
Communicator& lone() {
  static std::unique_ptr<Communicator> comm = [] {
    auto created = Communicator::from_environment();
    if (!created.ok()) FAIL(created.status().ToString());
    return *std::move(created);
  }();
  return *comm;
}

ZeroOptions small_options(uint32_t stage) {
  ZeroOptions o;
  o.stage = stage;
  o.bucket_bytes = 8 << 10;
  o.alignment = 8;
  o.groups = {AdamGroup{.lr = 1e-2F}, AdamGroup{.lr = 3e-3F}};
  o.optimizer.max_grad_norm = 30.0F;
  o.persist_below_bytes = 128;  // stage 3: only the norms and the bias stay whole
  return o;
}

TEST_CASE("One rank at stage 1, 2 or 3 is the plain offload optimizer, bit for bit", "[zero]") {
  const uint32_t stage = GENERATE(1U, 2U, 3U);
  INFO("stage " << stage);
  const auto model = testing::zero_model();
  const ZeroOptions o = small_options(stage);
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  auto engine = ZeroEngine::create(**runtime, lone(), model.params, o);
  REQUIRE(engine.ok());
  auto reference = testing::ZeroReference::create(model, o, "");
  REQUIRE(reference.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  for (int step = 0; step < 6; ++step) {
    REQUIRE(
        testing::zero_micro_step(**engine, **stream, model, o.grad_type, step, 0, 0, false).ok());
    REQUIRE((*reference)->micro_step(step, 0, 1, false).ok());
    auto got = (*engine)->step();
    auto want = (*reference)->step();
    REQUIRE(got.ok());
    REQUIRE(want.ok());
    CHECK(got->grad_norm == want->grad_norm);
    CHECK(got->clip_coef == want->clip_coef);
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      auto a = testing::zero_param(**engine, **stream, p);
      auto b = (*reference)->param(p);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(*a == *b);
    }
  }
  CHECK((*engine)->stats().steps == 6);
  CHECK((*engine)->stats().reduce_scatters == 6 * (*engine)->layout().groups().size());
}

TEST_CASE(
    "The overlapped step at stage 1, 2 or 3 is bitwise the plain one, over micro-steps, "
    "clipping and an overflow",
    "[zero][overlap]") {
  const uint32_t stage = GENERATE(1U, 2U, 3U);
  INFO("stage " << stage);
  const auto model = testing::zero_model();
  ZeroOptions plain_options = small_options(stage);
  plain_options.accumulation_steps = 2;
  // The norms of this model's steps are 71.3-72.1: clipping bites in steps 0 and 1 only.
  plain_options.optimizer.max_grad_norm = 71.9F;
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
  uint64_t early = 0;
  for (int step = 0; step < 6; ++step) {
    const bool inf = step == 3;
    for (uint32_t micro = 0; micro < 2; ++micro) {
      REQUIRE(testing::zero_micro_step(**plain, **plain_stream, model, plain_options.grad_type,
                                       step, micro, 0, inf && micro == 1)
                  .ok());
      REQUIRE(testing::zero_micro_step(**overlap, **overlap_stream, model,
                                       overlap_options.grad_type, step, micro, 0, inf && micro == 1)
                  .ok());
    }
    (*overlap)->wait_for_gradients();
    (*overlap)->optimizer().wait_for_early_steps();
    auto want = (*plain)->step();
    auto got = (*overlap)->step();
    REQUIRE(want.ok());
    REQUIRE(got.ok());
    CHECK(got->skipped == want->skipped);
    CHECK(got->grad_norm == want->grad_norm);
    CHECK(got->clip_coef == want->clip_coef);
    early += got->early_elements;
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      auto a = testing::zero_param(**overlap, **overlap_stream, p);
      auto b = testing::zero_param(**plain, **plain_stream, p);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(*a == *b);
    }
  }
  CHECK(early > 0);  // the early steps happened and were kept in the steps that allowed it
  CHECK((*overlap)->optimizer().stats().overlap_rollbacks > 0);  // the overflow, the clipping
}

TEST_CASE("ZeroParam.fill draws each parameter's initial values once, as its group is set up",
          "[zero]") {
  const uint32_t stage = GENERATE(1U, 3U);
  INFO("stage " << stage);
  const auto model = testing::zero_model();
  const ZeroOptions o = small_options(stage);
  auto given_runtime = testing::zero_runtime("");
  auto filled_runtime = testing::zero_runtime("");
  REQUIRE(given_runtime.ok());
  REQUIRE(filled_runtime.ok());
  auto given = ZeroEngine::create(**given_runtime, lone(), model.params, o);
  REQUIRE(given.ok());
  std::vector<uint32_t> calls;
  std::vector<ZeroParam> params = model.params;
  for (uint32_t p = 0; p < params.size(); ++p) {
    params[p].initial = {};
    params[p].fill = [&calls, &model, p](std::span<float> out) {
      calls.push_back(p);
      REQUIRE(out.size() == model.initial[p].size());
      std::copy(model.initial[p].begin(), model.initial[p].end(), out.begin());
      return absl::OkStatus();
    };
  }
  auto filled = ZeroEngine::create(**filled_runtime, lone(), params, o);
  REQUIRE(filled.ok());
  // Once each, in the layout's order (group by group).
  std::vector<uint32_t> layout_order;
  for (uint32_t g = 0; g < (*filled)->layout().groups().size(); ++g) {
    for (const ZeroSegment& seg : (*filled)->layout().group_segments(g)) {
      layout_order.push_back(seg.param);
    }
  }
  CHECK(calls == layout_order);
  auto given_stream = (*given_runtime)->device().create_stream();
  auto filled_stream = (*filled_runtime)->device().create_stream();
  REQUIRE(given_stream.ok());
  REQUIRE(filled_stream.ok());
  for (uint32_t p = 0; p < params.size(); ++p) {
    auto a = testing::zero_param(**filled, **filled_stream, p);
    auto b = testing::zero_param(**given, **given_stream, p);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);
  }

  // A fill that fails ends create() with its error and the parameter's name; both kinds of
  // initial value at once is refused.
  params[2].fill = [](std::span<float>) {
    return absl::DataLossError("the initializer's file is truncated");
  };
  auto other = testing::zero_runtime("");
  REQUIRE(other.ok());
  auto failed = ZeroEngine::create(**other, lone(), params, o);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(failed.status().message()),
             Catch::Contains("filling the initial values of 'block0.norm'") &&
                 Catch::Contains("the initializer's file is truncated"));
  params[2].initial = model.params[2].initial;
  auto both = ZeroEngine::create(**other, lone(), params, o);
  REQUIRE_FALSE(both.ok());
  CHECK_THAT(std::string(both.status().message()),
             Catch::Contains("'block0.norm' has both initial values and a fill function"));
}

TEST_CASE("ZeroEngine refuses bad options and misuse with a precise error, never a hang",
          "[zero]") {
  const auto model = testing::zero_model();
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  SECTION("options") {
    ZeroOptions o = small_options(4);
    auto e = ZeroEngine::create(**runtime, lone(), model.params, o);
    CHECK(absl::StrContains(e.status().message(), "stage 4 is not a ZeRO stage"));
    o = small_options(3);
    o.persist_below_bytes = 0;
    o.max_live_bytes = 1024;
    CHECK(
        absl::StrContains(ZeroEngine::create(**runtime, lone(), model.params, o).status().message(),
                          "above max_live_bytes = 1024"));
    o = small_options(2);
    o.accumulation_steps = 0;
    CHECK(
        absl::StrContains(ZeroEngine::create(**runtime, lone(), model.params, o).status().message(),
                          "accumulation_steps is 0"));
    o = small_options(2);
    o.param_home = TierKind::kNvme;
    CHECK(ZeroEngine::create(**runtime, lone(), model.params, o).status().code() ==
          absl::StatusCode::kInvalidArgument);
    auto params = model.params;
    params[1].group = 7;
    CHECK(absl::StrContains(
        ZeroEngine::create(**runtime, lone(), params, small_options(2)).status().message(),
        "group 7"));
    params = model.params;
    params[0].initial = params[0].initial.subspan(1);
    CHECK(absl::StrContains(
        ZeroEngine::create(**runtime, lone(), params, small_options(2)).status().message(),
        "initial values"));
  }
  SECTION("gradients") {
    ZeroOptions o = small_options(2);
    o.gradient_buckets = 1;
    auto engine = ZeroEngine::create(**runtime, lone(), model.params, o);
    REQUIRE(engine.ok());
    ZeroEngine& e = **engine;
    // "head.weight" shares its group with "block1.mlp"; "block0.norm" is in another group.
    const ZeroParamId head = *e.find("head.weight");
    const ZeroParamId norm = *e.find("block0.norm");
    REQUIRE(e.layout().groups()[e.layout().param_segment(head.index).group].segment_count == 2);
    REQUIRE(e.layout().param_segment(norm.index).group !=
            e.layout().param_segment(head.index).group);
    CHECK(absl::StrContains(e.grad_ready(head, **stream).message(), "acquire_grad() it first"));
    REQUIRE(e.acquire_grad(head, TierKind::kGpu, **stream).ok());
    CHECK(absl::StrContains(e.acquire_grad(head, TierKind::kGpu, **stream).status().message(),
                            "already acquired"));
    REQUIRE(e.grad_ready(head, **stream).ok());
    CHECK(absl::StrContains(e.acquire_grad(head, TierKind::kGpu, **stream).status().message(),
                            "already ready in this micro-step"));
    // head's group holds the only bucket while it waits for block1.mlp.
    auto blocked = e.acquire_grad(norm, TierKind::kGpu, **stream);
    CHECK(blocked.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(blocked.status().message(), "raise ZeroOptions.gradient_buckets"));
    const ZeroParamId first{0};
    auto early = e.step();
    CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(early.status().message(), "completed 0 of 1 micro-steps"));
    CHECK(e.zero_grad().ok());
    // After zero_grad a full micro-step and a step work.
    REQUIRE(testing::zero_micro_step(e, **stream, model, o.grad_type, 0, 0, 0, false).ok());
    CHECK(e.step().ok());
    CHECK(e.find("nope").status().code() == absl::StatusCode::kNotFound);
    CHECK(e.param_view(ZeroParamId{99}).status().code() == absl::StatusCode::kNotFound);
    std::vector<float> wrong(3);
    CHECK(absl::StrContains(e.read_state(first, wrong, {}, {}).message(), "holds 3 values"));
  }
}

// Issue 36, defect 2: at stages 1–2 a parameter is a slice of its group's flat tensor, and the
// store's kOverwrite leaves a whole tensor undefined: acquired so, one parameter's write lost
// the group's other parameters (the copy in the tier written was made without a fetch).
TEST_CASE("Stages 1-2: overwriting one parameter keeps its group's others", "[zero]") {
  const uint32_t stage = GENERATE(1U, 2U);
  INFO("stage " << stage);
  const auto model = testing::zero_model();
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  ZeroOptions o = small_options(stage);
  o.param_home = TierKind::kCpu;
  auto engine = ZeroEngine::create(**runtime, lone(), model.params, o);
  REQUIRE(engine.ok());
  ZeroEngine& e = **engine;
  // Two parameters of one group.
  std::optional<ZeroParamId> a, b;
  for (uint32_t i = 0; i < e.param_count() && !b; ++i) {
    for (uint32_t j = i + 1; j < e.param_count(); ++j) {
      if (e.layout().param_segment(i).group == e.layout().param_segment(j).group) {
        a = ZeroParamId{i};
        b = ZeroParamId{j};
        break;
      }
    }
  }
  REQUIRE(b.has_value());
  auto bytes_of = [&](ZeroParamId id, TierKind tier) {
    const uint64_t n = e.param_view(id)->count * 2;  // fp16
    auto data = e.acquire_param(id, tier, **stream);
    REQUIRE(data.ok());
    REQUIRE((*runtime)->device().synchronize(**stream).ok());
    const auto* p = static_cast<const std::byte*>(*data);
    std::vector<std::byte> out(p, p + n);
    REQUIRE(e.release_param(id, **stream).ok());
    return out;
  };
  auto fill = [&](ZeroParamId id, TierKind tier, AccessMode mode, int byte) {
    const uint64_t n = e.param_view(id)->count * 2;  // fp16
    auto data = e.acquire_param(id, tier, **stream, mode);
    REQUIRE(data.ok());
    REQUIRE((*runtime)->device().synchronize(**stream).ok());
    std::memset(*data, byte, n);
    REQUIRE(e.release_param(id, **stream).ok());
  };
  auto all_are = [](const std::vector<std::byte>& v, int byte) {
    return std::all_of(v.begin(), v.end(), [&](std::byte x) { return x == std::byte(byte); });
  };
  // b's newest bytes in the GPU tier (fp16 2.0), the CPU tier's copy stale: an overwrite of a
  // in the CPU tier that fetched nothing would bring b's old values back.
  fill(*b, TierKind::kGpu, AccessMode::kWrite, 0x40);
  fill(*a, TierKind::kCpu, AccessMode::kOverwrite, 0x3c);  // fp16 1.0
  CHECK(all_are(bytes_of(*b, TierKind::kCpu), 0x40));
  CHECK(all_are(bytes_of(*b, TierKind::kGpu), 0x40));
  CHECK(all_are(bytes_of(*a, TierKind::kGpu), 0x3c));
}

TEST_CASE("Stage 3 refuses misuse with a precise error", "[zero]") {
  const auto model = testing::zero_model();
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  ZeroOptions o = small_options(3);
  o.persist_below_bytes = 128;
  // Room for one gathered group: the largest.
  uint64_t largest = 0;
  {
    auto probe = ZeroEngine::create(**runtime, lone(), model.params, o);
    REQUIRE(probe.ok());
    for (const ZeroFlatGroup& g : (*probe)->layout().groups()) {
      if (!g.persistent) largest = std::max(largest, g.padded * 2);
    }
  }
  o.max_live_bytes = largest;
  auto engine = ZeroEngine::create(**runtime, lone(), model.params, o);
  REQUIRE(engine.ok());
  ZeroEngine& e = **engine;
  const ZeroParamId embed = *e.find("embed.weight");
  const ZeroParamId mlp = *e.find("block1.mlp");
  const ZeroParamId bias = *e.find("block0.bias");
  REQUIRE(e.layout().param_segment(embed.index).group != e.layout().param_segment(mlp.index).group);
  // Persistent parameters keep a view and may be written; partitioned ones have neither.
  CHECK(e.param_view(bias).ok());
  CHECK(e.param_view(embed).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(
      e.acquire_param(embed, TierKind::kGpu, **stream, AccessMode::kWrite).status().message(),
      "read-only"));
  // Issue 36, defect 2: kOverwrite is a write too (it used to reach the gathered buffer).
  auto overwrite = e.acquire_param(embed, TierKind::kGpu, **stream, AccessMode::kOverwrite);
  CHECK(overwrite.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(overwrite.status().message(), "read-only"));
  CHECK(absl::StrContains(e.release_param(embed, **stream).message(), "is not acquired"));
  // Two groups in use at once need more than the live limit.
  REQUIRE(e.acquire_param(embed, TierKind::kGpu, **stream).ok());
  auto second = e.acquire_param(mlp, TierKind::kGpu, **stream);
  CHECK(second.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(second.status().message(), "raise max_live_bytes"));
  CHECK(e.stats().gathered_bytes <= o.max_live_bytes);
  // step() while a parameter is held names it; after release the engine goes on.
  auto early = e.step();
  CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(early.status().message(), "embed.weight"));
  REQUIRE(e.release_param(embed, **stream).ok());
  // The idle group is dropped to make room: the second use works now.
  REQUIRE(e.acquire_param(mlp, TierKind::kGpu, **stream).ok());
  REQUIRE(e.release_param(mlp, **stream).ok());
  CHECK(e.set_fetch_order(std::vector<ZeroParamId>{ZeroParamId{42}}).code() ==
        absl::StatusCode::kNotFound);
  REQUIRE(testing::zero_micro_step(e, **stream, model, o.grad_type, 0, 0, 0, false).ok());
  CHECK(e.step().ok());
  engine->reset();  // one engine per runtime at a time (its tensors' names)
  ZeroOptions two = small_options(2);
  auto stage2 = ZeroEngine::create(**runtime, lone(), model.params, two);
  REQUIRE(stage2.ok());
  CHECK((*stage2)->set_fetch_order(std::vector<ZeroParamId>{embed}).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("Stage 3's live limit is bounded by the GPU tier, so no rank's gather finds no room",
          "[zero]") {
  const auto model = testing::zero_model();
  ZeroOptions o = small_options(3);  // max_live_bytes unset: automatic
  testing::LogCapture log;
  {
    auto tiny = testing::zero_runtime("", "8KiB");
    REQUIRE(tiny.ok());
    auto engine = ZeroEngine::create(**tiny, lone(), model.params, o);
    CHECK(engine.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(engine.status().message(), "raise STRATA_GPU_BYTES"));
  }
  auto runtime = testing::zero_runtime("", "40KiB");
  REQUIRE(runtime.ok());
  auto engine = ZeroEngine::create(**runtime, lone(), model.params, o);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  const uint64_t capacity = (*runtime)->store().stats().tiers[0].capacity;
  uint64_t buckets = 0;
  for (uint64_t b : (*engine)->memory().buckets) buckets += b;
  for (int step = 0; step < 3; ++step) {
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      auto got = (*engine)->acquire_param(ZeroParamId{p}, TierKind::kGpu, **stream);
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      REQUIRE((*engine)->release_param(ZeroParamId{p}, **stream).ok());
    }
    REQUIRE(
        testing::zero_micro_step(**engine, **stream, model, o.grad_type, step, 0, 0, false).ok());
    REQUIRE((*engine)->step().ok());
  }
  CHECK((*engine)->stats().gathers_prefetched > 0);
  CHECK((*engine)->stats().gathered_peak_bytes <= capacity - buckets);
  // Automatic fits the tier without a word; a value set above what the tier holds is lowered
  // with a warning naming it, once; one that fits is silent.
  CHECK(log.matching("max_live_bytes").empty());
  uint64_t largest = 0;  // gathered bytes of the largest partitioned group (fp16 parameters)
  for (const auto& g : (*engine)->layout().groups()) {
    if (!g.persistent) largest = std::max<uint64_t>(largest, g.padded * 2);
  }
  REQUIRE(o.param_type == ParamType::kF16);
  engine->reset();
  o.max_live_bytes = 12345678;
  for (int i = 0; i < 2; ++i) {
    auto again = ZeroEngine::create(**runtime, lone(), model.params, o);
    REQUIRE(again.ok());
  }
  CHECK(log.matching("max_live_bytes = 12345678 is more than the gpu tier can hold").size() == 1);
  o.max_live_bytes = largest;
  REQUIRE(ZeroEngine::create(**runtime, lone(), model.params, o).ok());
  CHECK(log.matching("max_live_bytes").size() == 1);
}

TEST_CASE("A damaged ZeRO checkpoint is refused before anything changes", "[zero]") {
  TempDir dir("strata-zero-damaged");
  const auto model = testing::zero_model();
  auto runtime = testing::zero_runtime("");
  REQUIRE(runtime.ok());
  auto engine = ZeroEngine::create(**runtime, lone(), model.params, small_options(2));
  REQUIRE(engine.ok());
  const std::string ckpt = dir.path() + "/c";
  REQUIRE((*engine)->save(ckpt).ok());
  std::string rank_file;
  for (const auto& entry : std::filesystem::directory_iterator(ckpt)) {
    if (entry.path().extension() == ".state") rank_file = entry.path().string();
  }
  REQUIRE(!rank_file.empty());
  SECTION("a flipped byte in a rank file") {
    std::fstream f(rank_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
    f.close();
    auto st = (*engine)->load(ckpt);
    CHECK(absl::StrContains(st.message(), "fails its checksum"));
    CHECK(absl::StrContains(st.message(), "nothing was loaded"));
  }
  SECTION("a truncated manifest") {
    const std::string manifest = ckpt + "/zero.manifest";
    const auto size = std::filesystem::file_size(manifest);
    std::filesystem::resize_file(manifest, size - 10);
    auto st = (*engine)->load(ckpt);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(st.message(), "zero.manifest"));
  }
  SECTION("no checkpoint") {
    auto st = (*engine)->load(dir.path() + "/none");
    CHECK(absl::StrContains(st.message(), "is this a directory written by ZeroEngine::save()"));
  }
  // Still usable.
  auto stream = (*runtime)->device().create_stream();
  REQUIRE(stream.ok());
  REQUIRE(testing::zero_micro_step(**engine, **stream, model, GradType::kF16, 0, 0, 0, false).ok());
  CHECK((*engine)->step().ok());
}

TEST_CASE("load() drops the gradients of micro-steps taken before it", "[zero]") {
  const uint32_t stage = GENERATE(1U, 2U);
  INFO("stage " << stage);
  TempDir dir("strata-zero-load");
  const auto model = testing::zero_model();
  ZeroOptions o = small_options(stage);
  o.accumulation_steps = 2;
  struct Run {
    std::unique_ptr<Runtime> runtime;
    std::unique_ptr<Stream> stream;
    std::unique_ptr<ZeroEngine> engine;
  };
  auto start = [&] {
    Run r;
    r.runtime = *testing::zero_runtime("");
    r.stream = *r.runtime->device().create_stream();
    r.engine = *ZeroEngine::create(*r.runtime, lone(), model.params, o);
    return r;
  };
  Run a = start();
  for (uint32_t micro = 0; micro < 2; ++micro) {
    REQUIRE(testing::zero_micro_step(*a.engine, *a.stream, model, o.grad_type, 0, micro, 0, false)
                .ok());
  }
  REQUIRE(a.engine->step().ok());
  REQUIRE(a.engine->save(dir.path() + "/c").ok());
  // A micro-step whose gradients the load must drop, then a whole step.
  REQUIRE(testing::zero_micro_step(*a.engine, *a.stream, model, o.grad_type, 7, 0, 0, false).ok());
  REQUIRE(a.engine->load(dir.path() + "/c").ok());
  Run b = start();
  REQUIRE(b.engine->load(dir.path() + "/c").ok());
  for (Run* r : {&a, &b}) {
    for (uint32_t micro = 0; micro < 2; ++micro) {
      REQUIRE(
          testing::zero_micro_step(*r->engine, *r->stream, model, o.grad_type, 1, micro, 0, false)
              .ok());
    }
    REQUIRE(r->engine->step().ok());
  }
  for (uint32_t p = 0; p < model.params.size(); ++p) {
    CHECK(*testing::zero_param(*a.engine, *a.stream, p) ==
          *testing::zero_param(*b.engine, *b.stream, p));
  }
}

TEST_CASE(
    "A rank killed mid-step fails the others with the Communicator's error, the last "
    "checkpoint loads",
    "[zero][failure]") {
  using namespace std::chrono_literals;
  // Stage 2: killed halfway through its gradients; stage 3: halfway through the forward's
  // gathers.
  const std::string stage = GENERATE("2", "3");
  INFO("stage " << stage);
  TempDir dir("strata-zero-fault");
  const std::string ckpt = dir.path() + "/ckpt";
  const std::map<std::string, std::string> env = {
      {"STRATA_COMM_BACKEND", "gloo"}, {"STRATA_COMM_TIMEOUT", "20s"}, {"ZERO_RANK_STAGE", stage}};
  {
    testing::RankProcesses job({STRATA_ZERO_RANK, "fault", ckpt}, 3, {0, 1, 2},
                               testing::free_port(), env);
    for (const testing::RankOutcome& r : job.wait(90s)) {
      INFO("rank " << r.rank << ": " << r.output);
      CHECK_FALSE(r.killed_by_test);
      if (r.rank == 2) {
        CHECK_FALSE(r.exited);  // SIGKILL
        continue;
      }
      CHECK(r.exited);
      CHECK(r.status == 1);
      CHECK(absl::StrContains(r.output, "Rank 2"));
      CHECK(absl::StrContains(r.output, "Rank(s) at fault: 2"));
    }
  }
  testing::RankProcesses resume({STRATA_ZERO_RANK, "load-check", ckpt}, 2, {0, 1},
                                testing::free_port(), env);
  for (const testing::RankOutcome& r : resume.wait(90s)) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK(r.exited);
    CHECK(r.status == 0);
  }
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Gradient accumulation lands every micro-step's gradient exactly once: the optimizer's norm is
// the norm of the exact sum, step after step (dyadic values: every sum is exact).
TEST_CASE("Accumulated gradients land exactly once per micro-step, every step", "[optimizer]") {
  const auto model = testing::zero_model();
  ZeroOptions o = small_options(2);
  o.param_type = GradType::kF32 == GradType::kF32 ? ParamType::kF32 : ParamType::kF16;
  o.grad_type = GradType::kF32;
  auto reference = testing::ZeroReference::create(model, o, "");
  REQUIRE(reference.ok());
  for (int step = 0; step < 30; ++step) {
    double sq = 0;
    for (uint32_t p = 0; p < model.params.size(); ++p) {
      for (uint64_t i = 0; i < model.initial[p].size(); ++i) {
        const double g = static_cast<double>(testing::synthetic_grad(step, 0, 0, p, i)) +
                         testing::synthetic_grad(step, 1, 0, p, i);
        sq += g * g;
      }
    }
    REQUIRE((*reference)->micro_step(step, 0, 1, false).ok());
    REQUIRE((*reference)->micro_step(step, 1, 1, false).ok());
    auto result = (*reference)->step();
    REQUIRE(result.ok());
    INFO("step " << step);
    CHECK(result->grad_norm == std::sqrt(sq));
  }
}

}  // namespace
}  // namespace strata
