// OffloadOptimizer end to end on the host backend: equivalence with an in-memory AdamW step for
// step (states in the CPU tier and on NVMe), bitwise checkpoint/resume, overflow skipping, I/O
// faults during the NVMe write-back, gradient accumulation, concurrency and bad input.
#include "strata/optimizer/offload_optimizer.h"

#include <absl/strings/match.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <thread>
#include <type_traits>

#include "optimizer/optimizer_rig.h"

namespace strata {
namespace {

using testing::initial_weights;
using testing::Problem;
using testing::Reference;
using testing::Rig;
using testing::RigOptions;
using testing::TempDir;

// Largest |a - b| / max(1, |b|) over all parameters.
double max_rel_diff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].size() == b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) {
      const double d = std::fabs(static_cast<double>(a[t][i]) - b[t][i]) /
                       std::max(1.0, std::fabs(static_cast<double>(b[t][i])));
      worst = std::max(worst, std::isnan(d) ? 1e30 : d);
    }
  }
  return worst;
}

std::vector<std::vector<float>> rounded_to(const std::vector<std::vector<float>>& g,
                                           GradType type) {
  auto out = g;
  for (auto& t : out) {
    for (float& x : t) {
      if (type == GradType::kF16) x = adam_detail::half_to_float(adam_detail::float_to_half(x));
      if (type == GradType::kBF16) x = adam_detail::bf16_to_float(adam_detail::float_to_bf16(x));
    }
  }
  return out;
}

struct Variant {
  const char* name;
  TierKind home;
  ParamType param;
  GradType grad;
  float max_norm;
  int micro_steps;
};

TEST_CASE("OffloadOptimizer matches an in-memory AdamW step for step", "[optimizer]") {
  const Variant v = GENERATE(
      Variant{"cpu states, fp16", TierKind::kCpu, ParamType::kF16, GradType::kF16, 0.0F, 1},
      Variant{"nvme states, fp16", TierKind::kNvme, ParamType::kF16, GradType::kF16, 0.0F, 1},
      Variant{"cpu states, bf16, clipped", TierKind::kCpu, ParamType::kBF16, GradType::kBF16, 0.5F,
              1},
      Variant{"nvme states, fp32, clipped, 3 micro-steps", TierKind::kNvme, ParamType::kF32,
              GradType::kF32, 0.5F, 3},
      Variant{"cpu states, fp32 grads into fp16 params, 2 micro-steps", TierKind::kCpu,
              ParamType::kF16, GradType::kF32, 0.0F, 2});
  INFO(v.name);
  TempDir dir("strata-opt");
  RigOptions o;
  o.state_home = v.home;
  o.param_type = v.param;
  o.grad_type = v.grad;
  o.max_grad_norm = v.max_norm;
  if (v.home == TierKind::kNvme) o.nvme_dir = dir.path();
  const auto init = initial_weights(7);
  Rig rig(o, init);
  Reference ref(v.param, o.hyper, init);
  Problem problem(11);
  CHECK(max_rel_diff(rig.model(), ref.model()) == 0);  // the model starts at the rounded master
  for (int step = 1; step <= 12; ++step) {
    INFO("step " << step);
    // Micro-steps: each hands the optimizer a share of the gradient; they accumulate.
    std::vector<std::vector<float>> ref_sum;
    const auto rig_model = rig.model();
    const auto ref_model = ref.model();
    for (int micro = 0; micro < v.micro_steps; ++micro) {
      const float share = static_cast<float>(micro + 1) * 2.0F /
                          static_cast<float>(v.micro_steps * (v.micro_steps + 1));
      rig.backward(problem.grads(rig_model, share));
      auto g = rounded_to(problem.grads(ref_model, share), v.grad);
      if (ref_sum.empty()) {
        ref_sum = g;
      } else {
        for (size_t t = 0; t < g.size(); ++t)
          for (size_t i = 0; i < g[t].size(); ++i) ref_sum[t][i] += g[t][i];
        ref_sum = rounded_to(ref_sum, v.grad);  // accumulated in the gradient's dtype
      }
    }
    auto result = rig.optimizer().step();
    REQUIRE(result.ok());
    CHECK_FALSE(result->skipped);
    CHECK(result->step == static_cast<uint64_t>(step));
    CHECK(result->params_updated == 3);
    ref.step(ref_sum, 1.0F, v.max_norm);
    if (v.max_norm > 0 && step == 1) CHECK(result->clip_coef < 1.0);
    // Tolerance: the kernels use float FMAs where the reference rounds each operation; a one-ulp
    // difference in a low-precision parameter then feeds slightly different gradients back.
    CHECK(max_rel_diff(rig.masters(), ref.master) < 2e-3);
    CHECK(max_rel_diff(rig.model(), ref.model()) < 2e-2);
  }
  const OffloadOptimizerStats stats = rig.optimizer().stats();
  CHECK(stats.steps == 12);
  CHECK(stats.grads_landed == 12u * 3 * v.micro_steps);
  CHECK(stats.chunk_elements == 2048);
  CHECK(stats.chunks == 5);  // 9913 elements
  if (v.home == TierKind::kNvme) {
    CHECK(stats.peak_staging_chunks <= 3);
    CHECK(stats.peak_staging_chunks >= 2);
    CHECK(stats.nvme_bytes_read > 0);
    CHECK(stats.nvme_bytes_written > 0);
  }
}

TEST_CASE("OffloadOptimizer: a step with states on NVMe moves the bytes of the states it steps",
          "[optimizer]") {
  // 9,913 elements (12 bytes of state each) in three tensors, far fewer than the elements of the
  // chunk derived from the staging chunk (36,864 here): a step reads and writes the states it
  // steps, each array rounded to the drive's block, never the chunk's whole capacity. Counted
  // by the optimizer and, independently, by the drive's own I/O counters.
  TempDir dir("strata-opt-bytes");
  RigOptions o;
  o.state_home = TierKind::kNvme;
  o.nvme_dir = dir.path();
  o.chunk_elements = 0;  // derived from the staging chunk, as by default
  const auto init = initial_weights(5);
  Rig rig(o, init);
  Reference ref(o.param_type, o.hyper, init);
  Problem problem(9);
  uint64_t elements = 0;
  for (const auto& shape : testing::model_shapes()) elements += shape.count;
  const uint64_t state_bytes = 12 * elements;
  // One I/O block (STRATA_IO_BLOCK in the rig: 64 KiB) of rounding per tensor at most.
  const uint64_t bound = state_bytes + testing::model_shapes().size() * (64 << 10);
  const IoStats io_before = rig.runtime().nvme()->stats().io;
  const OffloadOptimizerStats before = rig.optimizer().stats();
  constexpr int kSteps = 3;
  for (int step = 1; step <= kSteps; ++step) {
    const auto ref_model = ref.model();
    rig.backward(problem.grads(rig.model(), 1.0F));
    REQUIRE(rig.optimizer().step().ok());
    ref.step(rounded_to(problem.grads(ref_model, 1.0F), o.grad_type), 1.0F, 0.0F);
  }
  const IoStats io = rig.runtime().nvme()->stats().io;
  const OffloadOptimizerStats after = rig.optimizer().stats();
  const uint64_t read = (after.nvme_bytes_read - before.nvme_bytes_read) / kSteps;
  const uint64_t written = (after.nvme_bytes_written - before.nvme_bytes_written) / kSteps;
  const uint64_t drive_read = (io.bytes_read - io_before.bytes_read) / kSteps;
  const uint64_t drive_written = (io.bytes_written - io_before.bytes_written) / kSteps;
  INFO("state bytes " << state_bytes << ", per step: read " << read << ", written " << written
                      << "; the drive read " << drive_read << ", wrote " << drive_written);
  CHECK(read >= state_bytes);
  CHECK(written >= state_bytes);
  CHECK(read <= bound);
  CHECK(written <= bound);
  CHECK(drive_read <= bound);
  CHECK(drive_written <= bound);
  // The states the parameters were appended into (each append relays the shared chunk out)
  // still step as the in-memory reference does.
  CHECK(max_rel_diff(rig.masters(), ref.master) < 2e-3);
  // The swap space holds two slots of the states, not of whole chunks.
  CHECK(after.nvme_state_bytes >= 2 * state_bytes);
  CHECK(after.nvme_state_bytes <= 2 * bound);
}

TEST_CASE("OffloadOptimizer: the model learns", "[optimizer]") {
  // Loss of the linear layer before and after: an end-to-end sanity check that the steps go
  // downhill, independent of the reference.
  RigOptions o;
  Rig rig(o, initial_weights(3));
  Problem problem(5);
  auto loss = [&](const std::vector<std::vector<float>>& p) {
    double l = 0;
    for (int b = 0; b < testing::kBatch; ++b) {
      for (int out = 0; out < testing::kOut; ++out) {
        double y = p[1][out];
        for (int i = 0; i < testing::kIn; ++i) {
          y += p[0][out * testing::kIn + i] * problem.x[b * testing::kIn + i];
        }
        l += (y - problem.y[b * testing::kOut + out]) * (y - problem.y[b * testing::kOut + out]);
      }
    }
    return l;
  };
  const double before = loss(rig.model());
  for (int step = 0; step < 60; ++step) {
    rig.backward(problem.grads(rig.model(), 1.0F));
    REQUIRE(rig.optimizer().step().ok());
  }
  CHECK(loss(rig.model()) < 0.5 * before);
}

TEST_CASE("OffloadOptimizer: checkpoint and resume are bitwise identical", "[optimizer]") {
  const TierKind home = GENERATE(TierKind::kCpu, TierKind::kNvme);
  INFO("states in " << to_string(home));
  TempDir swap("strata-opt-swap");
  TempDir checkpoint("strata-opt-ckpt");
  RigOptions o;
  o.state_home = home;
  if (home == TierKind::kNvme) o.nvme_dir = swap.path();
  o.loss_scaling.scale = 1024.0F;
  o.loss_scaling.dynamic = true;
  o.loss_scaling.growth_interval = 2;  // the scale changes during the run: it must resume too
  Problem problem(21);
  auto train = [&](Rig& rig, int steps) {
    for (int i = 0; i < steps; ++i) {
      rig.backward(problem.grads(rig.model(), rig.optimizer().loss_scale()));
      auto r = rig.optimizer().step();
      REQUIRE(r.ok());
    }
  };
  // A learning-rate change mid-run is part of the state that must resume.
  auto halve_lr = [](Rig& rig) {
    AdamGroup g = *rig.optimizer().group(0);
    g.lr *= 0.5F;
    REQUIRE(rig.optimizer().set_group(0, g).ok());
  };
  {
    Rig rig(o, initial_weights(1));
    train(rig, 3);
    halve_lr(rig);
    train(rig, 2);
    REQUIRE(rig.optimizer().save(checkpoint.path()).ok());
    REQUIRE(rig.optimizer().save(checkpoint.path()).ok());  // replacing a checkpoint
  }
  std::vector<std::vector<std::byte>> uninterrupted;
  std::vector<std::vector<float>> uninterrupted_master;
  {
    Rig rig(o, initial_weights(1));
    train(rig, 3);
    halve_lr(rig);
    train(rig, 5);
    uninterrupted = rig.model_bytes();
    uninterrupted_master = rig.masters();
  }
  Rig resumed(o, initial_weights(42));  // other weights: load() must replace all of them
  REQUIRE(resumed.optimizer().load(checkpoint.path()).ok());
  CHECK(resumed.optimizer().step_count() == 5);
  CHECK(resumed.optimizer().group(0)->lr == o.hyper.lr * 0.5F);
  train(resumed, 3);
  CHECK(resumed.model_bytes() == uninterrupted);
  CHECK(resumed.masters() == uninterrupted_master);
  // Exactly one state file is left after replacing the checkpoint.
  int state_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(checkpoint.path())) {
    state_files += e.path().extension() == ".state" ? 1 : 0;
  }
  CHECK(state_files == 1);
}

TEST_CASE("OffloadOptimizer: an overflowed gradient skips the step and changes nothing",
          "[optimizer]") {
  const TierKind home = GENERATE(TierKind::kCpu, TierKind::kNvme);
  INFO("states in " << to_string(home));
  TempDir swap("strata-opt-swap");
  RigOptions o;
  o.state_home = home;
  if (home == TierKind::kNvme) o.nvme_dir = swap.path();
  o.loss_scaling.scale = 256.0F;
  o.loss_scaling.dynamic = true;
  Rig rig(o, initial_weights(4));
  Problem problem(8);
  rig.backward(problem.grads(rig.model(), 256.0F));
  REQUIRE(rig.optimizer().step().ok());
  const auto model = rig.model_bytes();
  std::vector<std::vector<float>> states[3];
  for (ParamId id : rig.ids()) {
    const uint64_t n = testing::model_shapes()[id.index].count;
    std::vector<float> m(n), a(n), s(n);
    REQUIRE(rig.optimizer().read_state(id, m, a, s).ok());
    states[0].push_back(m);
    states[1].push_back(a);
    states[2].push_back(s);
  }
  auto grads = problem.grads(rig.model(), 256.0F);
  grads[2][4321] = std::numeric_limits<float>::infinity();  // fp16 overflow in one element
  rig.backward(grads);
  auto result = rig.optimizer().step();
  REQUIRE(result.ok());
  CHECK(result->skipped);
  CHECK(result->step == 1);
  CHECK(result->loss_scale == 128.0F);  // backed off
  CHECK(rig.model_bytes() == model);
  for (ParamId id : rig.ids()) {
    const uint64_t n = testing::model_shapes()[id.index].count;
    std::vector<float> m(n), a(n), s(n);
    REQUIRE(rig.optimizer().read_state(id, m, a, s).ok());
    CHECK(m == states[0][id.index]);
    CHECK(a == states[1][id.index]);
    CHECK(s == states[2][id.index]);
    CHECK(rig.optimizer().param_step_count(id) == 1);
  }
  CHECK(rig.optimizer().stats().skipped_steps == 1);
  // The skipped gradients were dropped: the next step uses only new ones.
  rig.backward(problem.grads(rig.model(), 128.0F));
  result = rig.optimizer().step();
  REQUIRE(result.ok());
  CHECK_FALSE(result->skipped);
  CHECK(result->step == 2);
}

TEST_CASE("OffloadOptimizer: an I/O error writing states back fails the step, keeps the old ones",
          "[optimizer]") {
  TempDir swap("strata-opt-swap");
  auto faults = std::make_shared<FaultInjector>();
  RigOptions o;
  o.state_home = TierKind::kNvme;
  o.nvme_dir = swap.path();
  o.faults = faults;
  const auto init = initial_weights(6);
  Rig rig(o, init);
  Reference ref(o.param_type, o.hyper, init);
  Problem problem(9);
  auto one_step = [&] {
    rig.backward(problem.grads(rig.model(), 1.0F));
    ref.step(rounded_to(problem.grads(ref.model(), 1.0F), o.grad_type), 1.0F, 0.0F);
  };
  one_step();
  REQUIRE(rig.optimizer().step().ok());
  const auto model = rig.model_bytes();
  const auto masters = rig.masters();
  // The third chunk's write-back fails: earlier chunks were already stepped and copied to the
  // GPU, later ones not yet — the worst moment.
  FaultRule rule;
  rule.op = IoOp::kWrite;
  rule.skip = 2;  // a chunk's state (2048 × 12 bytes) is one 64 KiB I/O unit
  rule.times = UINT64_MAX;
  faults->add(rule);
  one_step();
  auto failed = rig.optimizer().step();
  REQUIRE_FALSE(failed.ok());
  INFO(failed.status().message());
  CHECK(absl::StrContains(failed.status().message(), "optimizer step 2 failed"));
  CHECK(absl::StrContains(failed.status().message(), "previous step"));
  CHECK(rig.optimizer().step_count() == 1);
  CHECK(rig.masters() == masters);    // the previous states are readable and current
  CHECK(rig.model_bytes() == model);  // and the parameters were put back
  CHECK(rig.optimizer().stats().failed_steps == 1);
  // Once the drive behaves again, the same step (gradients were kept) succeeds.
  faults->clear();
  auto retried = rig.optimizer().step();
  REQUIRE(retried.ok());
  CHECK(retried->step == 2);
  CHECK(max_rel_diff(rig.masters(), ref.master) < 1e-3);
}

TEST_CASE("OffloadOptimizer: gradients landing from several threads", "[optimizer]") {
  RigOptions o;
  o.chunk_elements = 1000;
  const auto init = initial_weights(12);
  Rig rig(o, init);
  Reference ref(o.param_type, o.hyper, init);
  Problem problem(13);
  TensorStore& store = rig.runtime().store();
  for (int step = 0; step < 5; ++step) {
    // Write all gradients first, then announce them from one thread per parameter.
    auto g = problem.grads(rig.model(), 1.0F);
    std::vector<TensorHandle> grads;
    for (const auto& shape : testing::model_shapes())
      grads.push_back(*store.find(shape.name + ".grad"));
    for (size_t i = 0; i < grads.size(); ++i) {
      auto data = store.acquire(grads[i], TierKind::kCpu, rig.stream(), AccessMode::kWrite);
      REQUIRE(data.ok());
      for (size_t k = 0; k < g[i].size(); ++k) {
        static_cast<uint16_t*>(*data)[k] = adam_detail::float_to_half(g[i][k]);
      }
      REQUIRE(store.release(grads[i], rig.stream()).ok());
    }
    std::vector<std::thread> threads;
    std::vector<absl::Status> results(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      threads.emplace_back([&, i] {
        auto stream = rig.runtime().device().create_stream();
        results[i] =
            stream.ok() ? rig.optimizer().grad_ready(rig.ids()[i], **stream) : stream.status();
        if (stream.ok()) (void)rig.runtime().device().synchronize(**stream);
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& r : results) REQUIRE(r.ok());
    REQUIRE(rig.optimizer().step().ok());
    ref.step(rounded_to(problem.grads(ref.model(), 1.0F), o.grad_type), 1.0F, 0.0F);
  }
  CHECK(max_rel_diff(rig.masters(), ref.master) < 1e-3);
}

TEST_CASE("OffloadOptimizer: bad input gets an error naming the problem", "[optimizer]") {
  TempDir dir("strata-opt-bad");
  RigOptions o;
  Rig rig(o, initial_weights(2));
  OffloadOptimizer& opt = rig.optimizer();
  TensorStore& store = rig.runtime().store();

  OffloadOptimizerOptions nvme;
  nvme.state_home = TierKind::kNvme;
  auto no_nvme = OffloadOptimizer::create(rig.runtime(), nvme);
  REQUIRE_FALSE(no_nvme.ok());
  CHECK(absl::StrContains(no_nvme.status().message(), "STRATA_NVME_PATHS"));

  OffloadOptimizerOptions gpu;
  gpu.state_home = TierKind::kGpu;
  CHECK(OffloadOptimizer::create(rig.runtime(), gpu).status().code() ==
        absl::StatusCode::kInvalidArgument);
  OffloadOptimizerOptions bad_lr;
  bad_lr.defaults.lr = std::numeric_limits<float>::quiet_NaN();
  auto nan_lr = OffloadOptimizer::create(rig.runtime(), bad_lr);
  CHECK(absl::StrContains(nan_lr.status().message(), "lr"));
  OffloadOptimizerOptions huge_chunk;
  huge_chunk.chunk_elements = uint64_t{1} << 40;
  CHECK(absl::StrContains(OffloadOptimizer::create(rig.runtime(), huge_chunk).status().message(),
                          "chunk_elements"));

  AdamGroup beta;
  beta.beta2 = 1.0F;
  CHECK(absl::StrContains(opt.add_group(beta).status().message(), "beta2"));
  // The groups validate with the kernels' rule (validate_adam), under the optimizer's name.
  CHECK(opt.add_group(beta).status().message() == "OffloadOptimizer: beta2 1 must be in [0, 1)");
  static_assert(std::is_same_v<AdamGroup, AdamHyper>);
  CHECK(opt.set_group(7, AdamGroup{}).code() == absl::StatusCode::kNotFound);
  CHECK(opt.set_loss_scale(0.0F).code() == absl::StatusCode::kInvalidArgument);

  auto param = store.create("extra", 100 * 2, TierKind::kCpu);
  auto grad = store.create("extra.grad", 100 * 2, TierKind::kCpu);
  REQUIRE(param.ok());
  REQUIRE(grad.ok());
  ParamSpec spec;
  spec.name = "extra";
  spec.param = *param;
  spec.grad = *grad;
  spec.count = 101;  // the tensors hold 100
  auto wrong_size = opt.add_param(spec);
  CHECK(absl::StrContains(wrong_size.status().message(), "200 bytes"));
  spec.count = 100;
  spec.name = "embed";
  CHECK(opt.add_param(spec).status().code() == absl::StatusCode::kAlreadyExists);
  spec.name = "extra";
  spec.group = 3;
  CHECK(absl::StrContains(opt.add_param(spec).status().message(), "group 3"));
  spec.group = 0;
  spec.param = TensorHandle{};
  CHECK_FALSE(opt.add_param(spec).ok());
  CHECK(store.find("extra.grad.host").status().code() == absl::StatusCode::kNotFound);

  CHECK(opt.grad_ready(ParamId{77}, rig.stream()).code() == absl::StatusCode::kNotFound);
  std::vector<float> too_small(3);
  CHECK(absl::StrContains(opt.read_state(rig.ids()[0], too_small, {}, {}).message(), "holds 3"));

  // Checkpoints: a missing one, a damaged one, one of another model.
  CHECK(opt.load(dir.path() + "/none").code() == absl::StatusCode::kNotFound);
  REQUIRE(opt.save(dir.path()).ok());
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".state") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  auto damaged = opt.load(dir.path());
  CHECK(damaged.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(damaged.message(), "checksum"));
  {
    std::ofstream manifest(dir.path() + "/optimizer.manifest");
    manifest << "not a checkpoint\n";
  }
  CHECK(opt.load(dir.path()).code() == absl::StatusCode::kDataLoss);
  TempDir other("strata-opt-other");
  RigOptions fp32;
  fp32.param_type = ParamType::kF32;
  {
    Rig different(fp32, initial_weights(2));
    REQUIRE(different.optimizer().save(other.path()).ok());
  }
  auto mismatch = opt.load(other.path());
  CHECK(mismatch.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(mismatch.message(), "does not match"));
  REQUIRE(store.destroy(*param).ok());
  REQUIRE(store.destroy(*grad).ok());
}

}  // namespace
}  // namespace strata
