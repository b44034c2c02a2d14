// cpp_trainer: a small MLP regression trained in C++ with its parameters, gradients and
// optimizer states managed by strata, checked against the same MLP trained all in memory.
//
// The model (model.h: 16 -> 256 -> 256 -> 256 -> 4, tanh) learns a fixed random "teacher" MLP.
//
// --zero-stage=0 (the default; offload_run.cc): one rank. Its parameters and gradients are
// store tensors homed in the CPU tier, computed on through a GPU arena smaller than parameters
// plus gradients (the example sizes it unless STRATA_GPU_BYTES says otherwise), so every step
// moves them. An OffloadOptimizer steps them, its AdamW states on NVMe (--states=nvme; the
// default when STRATA_NVME_PATHS gives an NVMe tier) or in the CPU tier (--states=cpu; the
// default without one).
//
// --zero-stage=1|2|3 (zero_run.cc): data parallel over the ranks of the job (strata-run -n N, or
// any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; alone, a job of one). A
// ZeroEngine holds the parameters in flat groups of at most --bucket-bytes and each rank keeps
// the optimizer states of its slice (stage 1), the reduced gradients of it (stage 2) and only its
// shard of the parameters (stage 3: gathered on use, prefetched along the recorded order, in the
// tier --param-home names). The global batch of 64 samples is split evenly over the ranks, each
// rank's share into --accumulation micro-batches.
//
// --overlap-step (either path): the overlapped optimizer step (OffloadOptimizerOptions::overlap):
// each parameter's Adam runs during backward, as its gradient of the step's last micro-step
// lands; the report adds, per step, the optimizer time exposed after backward and the early work
// kept or rolled back (optimizer_report.cc).
//
// The maths runs on the host: with the host backend the GPU tier is host memory, which is what
// CI has. (With the CUDA backend a real trainer launches kernels on the acquired pointers; this
// example then computes on CPU-tier copies instead, so it still runs.)
//
// Output: rank 0 prints the report (to stderr with --json=-, which keeps stdout for the JSON
// document alone); other ranks print only errors. Exit status: 0 when the loss fell below
// --max-loss and the weights match the in-memory run within --tolerance (and, at stages 1 to 3,
// every rank holds the same weights; and where the tensors must move through the arena, they
// did); 1 otherwise, or on an error (`cpp_trainer: <message>`, e.g. a rank of the job died); 2
// on a usage error.
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "json.h"
#include "strata/base/format_bytes.h"
#include "strata/base/size.h"
#include "strata/comm/launch.h"
#include "trainer.h"

namespace cpp_trainer {

SampleRange samples(int rank, int ranks, uint32_t micro, uint32_t micro_steps) {
  const int first = rank * kBatch / ranks;
  const int share = (rank + 1) * kBatch / ranks - first;
  const int m = static_cast<int>(micro), k = static_cast<int>(micro_steps);
  const int begin = first + m * share / k;
  return {begin, first + (m + 1) * share / k - begin};
}

std::vector<SampleRange> variable_samples(int step, uint32_t micro_steps) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + step));
  std::vector<int> cuts;  // micro_steps - 1 distinct cut points in [1, kBatch)
  while (cuts.size() + 1 < micro_steps) {
    const int c = 1 + static_cast<int>(rng() % (kBatch - 1));
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(kBatch);
  std::vector<SampleRange> out;
  int first = 0;
  for (int c : cuts) {
    out.push_back({first, c - first});
    first = c;
  }
  return out;
}

void count_state_traffic(const strata::OffloadOptimizerStats& before,
                         const strata::OffloadOptimizerStats& after, int steps, RunResult& result) {
  const auto per_step = static_cast<uint64_t>(steps);
  result.state_bytes = 12 * after.elements;
  result.nvme_read_per_step = (after.nvme_bytes_read - before.nvme_bytes_read) / per_step;
  result.nvme_written_per_step = (after.nvme_bytes_written - before.nvme_bytes_written) / per_step;
}

namespace {

// The GPU arena the example gives itself when STRATA_GPU_BYTES is not set: smaller than the
// model's parameters plus gradients (1070 KiB), so that they move through it every step, and
// large enough for what a stage holds there at once (stage 2's two gradient buckets beside a
// parameter; stage 3's buckets beside the gathered parameters; the activation window).
uint64_t own_arena_bytes(const Args& args) {
  if (args.offload_activations) return uint64_t{4} << 20;
  if (args.zero_stage == 0) return uint64_t{640} << 10;
  return args.zero_stage == 3 ? uint64_t{2} << 20 : uint64_t{1} << 20;
}

// Bytes of the model's parameters plus gradients (fp32).
uint64_t model_bytes() {
  uint64_t n = 0;
  for (const Layer& l : kLayers) n += layer_params(l);
  return 2 * 4 * n;
}

// A usage error found once the job is known (exit 2), as the flags' own (flags.cc).
int usage(const std::string& why) { return strata::cli::usage_error("cpp_trainer", why); }

int fail(const absl::Status& st) {
  std::fprintf(stderr, "cpp_trainer: %s\n", std::string(st.message()).c_str());
  return 1;
}

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f != nullptr && f != stdout) std::fclose(f);
  }
};

// FNV-1a over the final weights' bytes: two runs that must agree bit for bit compare these.
std::string weights_checksum(const Weights& weights) {
  uint64_t h = 1469598103934665603ULL;
  for (const auto& layer : weights) {
    const auto* p = reinterpret_cast<const unsigned char*>(layer.data());
    for (size_t i = 0; i < layer.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  }
  return absl::StrFormat("%016x", h);
}

// What a step moved of the optimizer states on NVMe, per byte of them: the larger of its reads
// and its writes over the state bytes (1.0: each byte once; 0 with the states in the CPU tier).
double state_ratio(const RunResult& r) {
  if (r.state_bytes == 0) return 0;
  return static_cast<double>(std::max(r.nvme_read_per_step, r.nvme_written_per_step)) /
         static_cast<double>(r.state_bytes);
}

Json report_json(const Args& args, const RunResult& r, double worst) {
  const auto& by_tier = r.model_states.by_tier;
  Json doc{{"backend", r.backend},
           {"ranks", r.ranks},
           {"stage", args.zero_stage},
           {"steps", args.steps},
           {"accumulation", args.accumulation},
           {"losses", json_floats(r.losses)},
           {"final_loss", strata::json_float(r.losses.empty() ? 0.0F : r.losses.back())},
           {"max_loss", strata::json_float(args.max_loss)},
           {"max_weight_difference", json_double(worst)},
           {"weights_checksum", weights_checksum(r.weights)},
           {"tolerance", json_double(args.tolerance)},
           {"max_replica_difference", json_double(r.replica_difference)},
           {"model_state_bytes_per_rank",
            {{"gpu", by_tier[static_cast<size_t>(strata::TierKind::kGpu)]},
             {"cpu", by_tier[static_cast<size_t>(strata::TierKind::kCpu)]},
             {"nvme", by_tier[static_cast<size_t>(strata::TierKind::kNvme)]},
             {"total", r.model_states.total()}}},
           {"gradient_bucket_bytes_per_rank", r.bucket_memory},
           {"comm_bytes_per_step", r.comm_bytes_per_step},
           {"bucket_bytes", args.zero_stage == 0 ? uint64_t{0} : args.bucket_bytes},
           {"groups", r.groups},
           {"states", strata::to_string(args.states)},
           {"bytes_moved", r.moved_bytes},
           {"gpu_tier_peak_bytes", r.gpu_tier_peak_bytes},
           {"gpu_arena_bytes", r.gpu_arena_bytes},
           {"optimizer_state_bytes", r.state_bytes},
           {"nvme_read_bytes_per_step", r.nvme_read_per_step},
           {"nvme_written_bytes_per_step", r.nvme_written_per_step},
           {"nvme_state_ratio", json_double(state_ratio(r))},
           {"overlap_step", args.overlap_step},
           {"optimizer", optimizer_json(r)}};
  if (args.offload_activations) {
    const strata::ActivationStashStats& a = r.activations;
    doc["variable_batches"] = args.variable_batches;
    doc["activations"] = {{"home", strata::to_string(args.activation_home)},
                          {"window_bytes", args.activation_window_bytes},
                          {"prefetch_bytes", args.activation_prefetch_bytes == UINT64_MAX
                                                 ? args.activation_window_bytes / 2
                                                 : args.activation_prefetch_bytes},
                          {"saved", a.saved},
                          {"saved_bytes", a.saved_bytes},
                          {"offloaded_bytes", a.offloaded_bytes},
                          {"kept", a.kept},
                          {"loads", a.loads},
                          {"loads_prefetched", a.loads_prefetched},
                          {"loads_kept", a.loads_kept},
                          {"loads_on_demand", a.loads_on_demand},
                          {"gpu_peak_bytes", a.gpu_peak_bytes},
                          {"window_waits", a.window_waits},
                          {"errors", a.errors}};
  }
  if (args.zero_stage == 3) {
    const strata::ZeroStats& z = r.zero_stats;
    doc["param_home"] = strata::to_string(args.param_home);
    doc["prefetch_bytes"] = args.prefetch_bytes;
    doc["max_live_bytes"] = args.max_live_bytes;
    doc["persist_below_bytes"] = args.persist_below_bytes;
    doc["reuse_window_bytes"] = args.reuse_window_bytes;
    doc["hpz_node_ranks"] = args.hpz_node_ranks;
    doc["partitioned_groups"] = r.partitioned_groups;
    doc["gathered_peak_bytes"] = z.gathered_peak_bytes;
    doc["exposed_comm_seconds"] = json_double(static_cast<double>(r.exposed_comm_ns) * 1e-9);
    doc["prefetch_late"] = z.prefetch_late;
    doc["fetch"] = {{"fetches", z.fetches},
                    {"gathers_on_demand", z.gathers_on_demand},
                    {"gathers_prefetched", z.gathers_prefetched},
                    {"reuses", z.reuses},
                    {"gathers_dropped_unused", z.gathers_dropped_unused},
                    {"order_changes", z.order_changes},
                    {"global_gather_bytes", z.global_gather_bytes},
                    {"node_gather_bytes", z.node_gather_bytes}};
  }
  return doc;
}

}  // namespace
}  // namespace cpp_trainer

int main(int argc, char** argv) {
  using namespace cpp_trainer;  // NOLINT(google-build-using-namespace)
  Args args;
  if (std::optional<int> exit_code = parse_flags(argc, argv, args)) return *exit_code;

  // The job this process is part of (strata-run, torchrun); alone: rank 0 of 1.
  auto launch = strata::LaunchInfo::from_environment();
  if (!launch.ok()) return fail(launch.status());
  const int ranks = launch->world_size;
  if (args.zero_stage == 3) {
    // A layout the engine rejects is its to explain (creating the engine fails with why).
    if (auto largest = largest_gather(args, ranks);
        largest.ok() && largest->bytes > args.max_live_bytes) {
      return usage(absl::StrFormat(
          "--max-live-bytes=%d is below the largest parameter group gathered whole, %d bytes "
          "(%s's at %d rank(s)); use --max-live-bytes=%d or more (or keep that parameter whole "
          "with a larger --persist-below-bytes)",
          args.max_live_bytes, largest->bytes, largest->first_param, ranks, largest->bytes));
    }
  }
  if (args.zero_stage == 0 && ranks > 1) {
    return usage(absl::StrFormat(
        "--zero-stage=0 trains on one rank, but this job has WORLD_SIZE=%d; use --zero-stage=1 "
        "or 2",
        ranks));
  }
  if (const int share = kBatch / ranks; share < static_cast<int>(args.accumulation)) {
    return usage(absl::StrFormat(
        "--accumulation=%u: with %d rank(s) a rank has %d of the %d samples of a step, too few "
        "for %u micro-batches; use at most %d",
        args.accumulation, ranks, share, kBatch, args.accumulation, std::max(share, 1)));
  }
  const bool rank0 = launch->rank == 0;
  std::unique_ptr<std::FILE, FileCloser> json_file;
  if (rank0 && !args.json.empty()) {
    json_file.reset(args.json == "-" ? stdout : std::fopen(args.json.c_str(), "w"));
    if (!json_file) {
      return usage(
          absl::StrFormat("--json=%s: cannot write it: %s", args.json, std::strerror(errno)));
    }
  }
  // With the JSON on stdout, the report goes to stderr.
  std::FILE* human = !rank0 ? nullptr : args.json == "-" ? stderr : stdout;

  // STRATA_* as set; without STRATA_GPU_BYTES the example sizes its own arena (the runtime's
  // default, most of the GPU, would hold this small model whole: nothing would move).
  auto config = strata::Config::from_environment();
  if (!config.ok()) return fail(config.status());
  const bool own_arena = !config->gpu_bytes.has_value();
  if (own_arena) config->gpu_bytes = strata::SizeSetting::of_bytes(own_arena_bytes(args));
  auto runtime = strata::Runtime::create(*config);
  if (!runtime.ok()) return fail(runtime.status());
  if (!args.states_given) {
    args.states = (*runtime)->nvme() != nullptr ? strata::TierKind::kNvme : strata::TierKind::kCpu;
  } else if (args.states == strata::TierKind::kNvme && (*runtime)->nvme() == nullptr) {
    return usage(
        "--states=nvme: this process has no NVMe tier; set STRATA_NVME_PATHS to a directory on "
        "a fast drive (and STRATA_NVME_BYTES), or use --states=cpu");
  }
  args.own_arena = own_arena;
  if (args.zero_stage == 3 && args.param_home == strata::TierKind::kNvme &&
      (*runtime)->nvme() == nullptr) {
    return usage(
        "--param-home=nvme: this process has no NVMe tier; set STRATA_NVME_PATHS to a directory "
        "on each rank's drive(s) (and STRATA_NVME_BYTES), or use --param-home=cpu");
  }
  if (args.offload_activations && (*runtime)->config().backend != strata::Backend::kHost) {
    return usage(
        "--offload-activations: this example computes on the host, which reads the "
        "GPU tier only on the host backend; set STRATA_BACKEND=host");
  }
  const Weights init = random_weights(1);
  const Weights teacher = random_weights(2);
  auto run = args.zero_stage == 0 ? run_offload(**runtime, args, init, teacher, human)
                                  : run_zero(**runtime, args, init, teacher, human);
  if (!run.ok()) return fail(run.status());
  RunResult& r = *run;
  if (!rank0) return 0;  // rank 0 checks and reports for the job
  r.gpu_arena_bytes = (*runtime)->gpu().capacity();
  r.backend = std::string(strata::to_string((*runtime)->config().backend));

  // The in-memory reference, on the same batches, one step per step.
  InMemory reference(init, kLr, kWeightDecay);
  std::mt19937 reference_rng(3);
  std::vector<float> reference_losses;
  for (int step = 1; step <= args.steps; ++step) {
    reference_losses.push_back(reference.step(make_batch(reference_rng, teacher)));
    if (step % 50 == 0 || step == 1) {
      const auto i = static_cast<size_t>(step - 1);
      std::fprintf(human, "step %4d  loss %.6f  (in memory %.6f)  optimizer %.3f ms exposed%s\n",
                   step, r.losses[i], reference_losses.back(),
                   static_cast<double>(r.optimizer_ns[i]) * 1e-6, overlap_note(args, r, i).c_str());
    }
  }
  double worst = 0;
  for (int k = 0; k < kDepth; ++k) {
    for (size_t i = 0; i < reference.w[k].size(); ++i) {
      const double want = reference.w[k][i];
      worst = std::max(worst, std::fabs(static_cast<double>(r.weights[k][i]) - want) /
                                  std::max(1.0, std::fabs(want)));
    }
  }
  const float loss = r.losses.back();
  std::fprintf(human, "final loss %.6f (threshold %.4f), in-memory run %.6f\n", loss, args.max_loss,
               reference_losses.back());
  std::fprintf(human, "largest weight difference to the in-memory run: %.3g (tolerance %.3g)\n",
               worst, args.tolerance);
  std::fprintf(
      human,
      "bytes moved between tiers: %.1f MiB; optimizer NVMe read %.1f MiB, written %.1f MiB\n",
      static_cast<double>(r.moved_bytes) / (1 << 20), static_cast<double>(r.nvme_read) / (1 << 20),
      static_cast<double>(r.nvme_written) / (1 << 20));
  if (args.states == strata::TierKind::kNvme) {
    std::fprintf(human,
                 "optimizer states on NVMe: %.1f KiB on this rank (12 bytes x %llu parameters); "
                 "a step read %.1f KiB and wrote %.1f KiB of them: %.2fx the state bytes\n",
                 static_cast<double>(r.state_bytes) / 1024,
                 static_cast<unsigned long long>(r.state_bytes / 12),
                 static_cast<double>(r.nvme_read_per_step) / 1024,
                 static_cast<double>(r.nvme_written_per_step) / 1024, state_ratio(r));
  }
  if (args.zero_stage > 0) {
    const auto& t = r.model_states.by_tier;
    std::fprintf(human,
                 "model states on this rank: gpu %.1f KiB, cpu %.1f KiB, nvme %.1f KiB (gradient "
                 "buckets %.1f KiB); communication per step %.1f KiB\n",
                 static_cast<double>(t[0]) / 1024, static_cast<double>(t[1]) / 1024,
                 static_cast<double>(t[2]) / 1024, static_cast<double>(r.bucket_memory) / 1024,
                 static_cast<double>(r.comm_bytes_per_step) / 1024);
    std::fprintf(human, "largest difference between the ranks' weights: %.3g\n",
                 r.replica_difference);
  }
  bool window_held = true;
  if (args.offload_activations) {
    const strata::ActivationStashStats& a = r.activations;
    std::fprintf(human,
                 "activations: %.1f KiB saved per step to %s, %llu loads (%llu prefetched, %llu "
                 "kept, %llu on demand); stash's GPU peak %.1f KiB (window %.1f KiB), %llu "
                 "waits for window room\n",
                 static_cast<double>(a.saved_bytes) / static_cast<double>(args.steps) / 1024,
                 std::string(strata::to_string(args.activation_home)).c_str(),
                 static_cast<unsigned long long>(a.loads),
                 static_cast<unsigned long long>(a.loads_prefetched),
                 static_cast<unsigned long long>(a.loads_kept),
                 static_cast<unsigned long long>(a.loads_on_demand),
                 static_cast<double>(a.gpu_peak_bytes) / 1024,
                 static_cast<double>(args.activation_window_bytes) / 1024,
                 static_cast<unsigned long long>(a.window_waits));
    window_held = a.gpu_peak_bytes <= args.activation_window_bytes && a.errors == 0;
  }
  print_optimizer_summary(human, args, r);
  std::fprintf(human, "GPU tier high-water mark: %.1f KiB\n",
               static_cast<double>(r.gpu_tier_peak_bytes) / 1024);
  if (args.zero_stage == 3) {
    const strata::ZeroStats& z = r.zero_stats;
    std::fprintf(human,
                 "stage 3 fetching: %llu uses of a group, %llu gathered on demand, %llu "
                 "prefetched (%llu late, %llu dropped unused), %llu reused; gathered peak %.1f "
                 "KiB (limit %.1f KiB); compute waited %.3f s for communication\n",
                 static_cast<unsigned long long>(z.fetches),
                 static_cast<unsigned long long>(z.gathers_on_demand),
                 static_cast<unsigned long long>(z.gathers_prefetched),
                 static_cast<unsigned long long>(z.prefetch_late),
                 static_cast<unsigned long long>(z.gathers_dropped_unused),
                 static_cast<unsigned long long>(z.reuses),
                 static_cast<double>(z.gathered_peak_bytes) / 1024,
                 static_cast<double>(args.max_live_bytes) / 1024,
                 static_cast<double>(r.exposed_comm_ns) * 1e-9);
    std::fprintf(human,
                 "stage 3 gathers: %.1f KiB over every rank, %.1f KiB within a node of %u "
                 "ranks (hpZ %s)\n",
                 static_cast<double>(z.global_gather_bytes) / 1024,
                 static_cast<double>(z.node_gather_bytes) / 1024, args.hpz_node_ranks,
                 args.hpz_node_ranks > 0 ? "on" : "off");
  }
  // Where the tensors must pass through the GPU arena, they must have moved: the example
  // computes in the GPU tier on the host backend (on CUDA it computes on CPU-tier copies), with
  // an arena smaller than parameters plus gradients (stages 0-2), or with stage 3's shards
  // homed outside it. Elsewhere nothing need move, and the report says what did.
  const bool host = (*runtime)->config().backend == strata::Backend::kHost;
  const bool moves_expected =
      host && (args.zero_stage == 3 ? args.param_home != strata::TierKind::kGpu
                                    : r.gpu_arena_bytes < model_bytes());
  const bool moved = r.every_rank_moved || !moves_expected;
  if (!moves_expected && r.moved_bytes == 0) {
    std::fprintf(human, "no tensor moved between tiers: %s\n",
                 host ? "the GPU arena holds the whole model"
                      : "on the cuda backend this example computes on CPU-tier copies");
  }
  const bool ok = loss < args.max_loss && worst < args.tolerance && moved &&
                  r.replica_difference == 0 && window_held;
  if (!window_held) std::fprintf(human, "the activations exceeded their GPU window\n");
  if (!moved) {
    std::fprintf(human, "no tensor moved, although the GPU arena (%s) is smaller than the model\n",
                 strata::format_bytes(r.gpu_arena_bytes).c_str());
  }
  std::fprintf(human, "%s\n", ok ? "PASS" : "FAIL");
  if (json_file) {
    Json doc = report_json(args, r, worst);
    doc["passed"] = ok;
    const std::string text = strata::json_line(doc, 2) + "\n";
    if (std::fputs(text.c_str(), json_file.get()) < 0 || std::fflush(json_file.get()) != 0) {
      return fail(absl::InternalError(
          absl::StrFormat("--json=%s: writing failed: %s", args.json, std::strerror(errno))));
    }
  }
  return ok ? 0 : 1;
}
