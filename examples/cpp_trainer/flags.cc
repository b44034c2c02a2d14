// cpp_trainer's flags, through the parser every strata tool uses (tools/cli.h): its forms
// (--name=value, --name value), --help and the suggestion for a misspelled flag; each flag keeps
// the message it gave for a bad value before it used that parser.
#include <absl/strings/str_format.h>

#include <climits>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "trainer.h"

namespace cpp_trainer {
namespace {

constexpr std::string_view kProgram = "cpp_trainer";

// The same message for a bad value as for a missing one.
strata::cli::Flag::ValueMessage always(std::string message) {
  return [message](std::optional<std::string_view>, std::string_view) { return message; };
}

// A choice's message: what the flag wants, then the value given ("--zero-stage wants 0, ...,
// not '4'").
strata::cli::Flag::ValueMessage choice(std::string wants) {
  return [wants](std::optional<std::string_view> value, std::string_view) {
    return absl::StrFormat("%s, not '%s'", wants, value.value_or(""));
  };
}

// A size's message: parse_size's reason after the flag's form, "(or 0)" where 0 is allowed; for
// a missing value, an example of one.
strata::cli::Flag::ValueMessage size(std::string flag, bool zero_ok, std::string example) {
  return [flag, zero_ok, example](std::optional<std::string_view> value, std::string_view why) {
    if (!value) return absl::StrFormat("%s wants a size, e.g. %s=%s", flag, flag, example);
    return absl::StrFormat("%s=%s%s", flag, why, zero_ok ? " (or 0)" : "");
  };
}

strata::TierKind tier(const std::string& name) {
  return name == "gpu"   ? strata::TierKind::kGpu
         : name == "cpu" ? strata::TierKind::kCpu
                         : strata::TierKind::kNvme;
}

}  // namespace

std::optional<int> parse_flags(int argc, char** argv, Args& args) {
  namespace cli = strata::cli;
  cli::FlagSet flags(
      std::string(kProgram),
      "Trains a small MLP with its parameters, gradients and optimizer states managed by strata "
      "and checks it against the same MLP trained all in memory (examples/cpp_trainer/README.md). "
      "SIZE: 65536, 64KiB, 1MiB, ...");
  uint64_t steps = static_cast<uint64_t>(args.steps);
  flags.add_uint64("steps", &steps, "training steps")
      .value_message(always("--steps wants a positive integer"));
  std::string states;  // none: chosen by the runtime's tiers (main.cc)
  cli::Flag& states_flag =
      flags.add_enum("states", &states, {"nvme", "cpu"},
                     "where the AdamW states live (default: nvme when STRATA_NVME_PATHS gives an "
                     "NVMe tier, else cpu)");
  double max_loss = 0.05;
  flags.add_double("max-loss", &max_loss, "pass when the final loss is below X")
      .value_message(always("--max-loss wants a number > 0"));
  flags
      .add_double("tolerance", &args.tolerance,
                  "pass when the weights are within X of the in-memory run's")
      .value_message(always("--tolerance wants a number > 0"));
  std::string stage = "0";
  flags
      .add_enum("zero-stage", &stage, {"0", "1", "2", "3"},
                "0: one rank, OffloadOptimizer; 1, 2, 3: ZeroEngine over the job's ranks")
      .value_message(choice("--zero-stage wants 0 (one rank, OffloadOptimizer), 1, 2 or 3"));
  flags.add_size("bucket-bytes", &args.bucket_bytes, "ZeroEngine's flat groups, at most SIZE")
      .value_message(size("--bucket-bytes", false, "64KiB"));
  uint64_t accumulation = args.accumulation;
  const std::string accumulation_message =
      absl::StrFormat("--accumulation wants micro-steps per step, 1 to %d", kBatch);
  flags.add_uint64("accumulation", &accumulation, "micro-steps per step")
      .value_message(always(accumulation_message));
  flags.add_bool("overlap-step", &args.overlap_step,
                 "the overlapped optimizer step: each parameter's Adam during backward");
  const std::string json_message = "--json wants a file name, or - for stdout";
  cli::Flag& json_flag =
      flags.add_string("json", &args.json, "also write a JSON report to FILE, or - for stdout")
          .value_message(always(json_message));
  // Stage 3.
  std::string param_home = "cpu";
  cli::Flag& param_home_flag =
      flags
          .add_enum("param-home", &param_home, {"gpu", "cpu", "nvme"},
                    "stage 3: where each rank's parameter shards live")
          .value_message(choice("--param-home wants gpu, cpu or nvme (where each rank's "
                                "parameter shards live)"));
  struct SizeOption {
    const char* name;
    uint64_t* out;
    bool zero_ok;
    const char* help;
  };
  const SizeOption stage3_sizes[] = {
      {"prefetch-bytes", &args.prefetch_bytes, true, "stage 3: gathered bytes fetched ahead"},
      {"max-live-bytes", &args.max_live_bytes, false, "stage 3: gathered bytes at most"},
      {"persist-below-bytes", &args.persist_below_bytes, true,
       "stage 3: parameters below SIZE stay whole"},
      {"reuse-window-bytes", &args.reuse_window_bytes, true,
       "stage 3: gathered bytes kept for reuse"}};
  std::vector<std::pair<std::string, cli::Flag*>> stage3_flags{{"--param-home", &param_home_flag}};
  for (const SizeOption& o : stage3_sizes) {
    const std::string flag = std::string("--") + o.name;
    stage3_flags.emplace_back(flag, &flags.add_size(o.name, o.out, o.help, o.zero_ok)
                                         .value_message(size(flag, o.zero_ok, "256KiB")));
  }
  bool hpz = false;
  stage3_flags.emplace_back(
      "--hpz",
      &flags.add_bool("hpz", &hpz,
                      "stage 3: hpZ, a secondary shard per node of LOCAL_WORLD_SIZE ranks"));
  // Activation offload (stage 0).
  flags.add_bool("offload-activations", &args.offload_activations,
                 "stage 0: the saved activations through an ActivationStash");
  std::string activation_home = "cpu";
  flags
      .add_enum("activation-home", &activation_home, {"cpu", "nvme"},
                "where saved activations wait for backward")
      .value_message(choice(
          "--activation-home wants cpu or nvme (where saved activations wait for backward)"));
  flags
      .add_size("activation-window-bytes", &args.activation_window_bytes,
                "the activations' GPU window")
      .value_message(size("--activation-window-bytes", false, "64KiB"));
  uint64_t activation_prefetch = 0;
  cli::Flag& activation_prefetch_flag =
      flags
          .add_size("activation-prefetch-bytes", &activation_prefetch,
                    "activations fetched ahead (default: half the window)", /*zero_ok=*/true)
          .value_message(size("--activation-prefetch-bytes", true, "64KiB"));
  const std::string trace_message = "--activation-trace wants a file name";
  cli::Flag& trace_flag = flags
                              .add_string("activation-trace", &args.activation_trace,
                                          "write arena-replay's trace of the window to FILE")
                              .value_message(always(trace_message));
  flags.add_bool("variable-batches", &args.variable_batches,
                 "micro-batches of random sizes (seeded): variable activation sizes");

  std::vector<std::string> positional;
  if (std::optional<int> exit_code = flags.parse_or_exit(argc, argv, &positional)) {
    return exit_code;
  }
  const auto usage = [](const std::string& message) -> std::optional<int> {
    return cli::usage_error(kProgram, message);
  };
  if (!positional.empty()) {
    return usage(absl::StrFormat("unexpected argument '%s': cpp_trainer takes flags only",
                                 positional.front()));
  }
  if (steps == 0 || steps > INT_MAX) return usage("--steps wants a positive integer");
  args.steps = static_cast<int>(steps);
  args.states_given = states_flag.was_set();
  if (args.states_given) args.states = tier(states);
  args.max_loss = static_cast<float>(max_loss);
  if (!(args.max_loss > 0)) return usage("--max-loss wants a number > 0");
  if (!(args.tolerance > 0)) return usage("--tolerance wants a number > 0");
  args.zero_stage = static_cast<uint32_t>(stage[0] - '0');
  if (accumulation == 0 || accumulation > kBatch) return usage(accumulation_message);
  args.accumulation = static_cast<uint32_t>(accumulation);
  if (json_flag.was_set() && args.json.empty()) return usage(json_message);
  args.param_home = tier(param_home);
  if (hpz) {
    // Nodes of LOCAL_WORLD_SIZE ranks, as strata-run, torchrun and Slurm set it.
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    char* end = nullptr;
    const unsigned long n = local == nullptr ? 0 : std::strtoul(local, &end, 10);
    if (local == nullptr || *end != '\0' || n == 0) {
      return usage("--hpz needs LOCAL_WORLD_SIZE (the ranks per node; strata-run sets it)");
    }
    args.hpz_node_ranks = static_cast<uint32_t>(n);
  }
  for (const auto& [name, flag] : stage3_flags) {
    if (flag->was_set() && args.stage3_flag.empty()) args.stage3_flag = name;
  }
  args.activation_home = tier(activation_home);
  if (activation_prefetch_flag.was_set()) args.activation_prefetch_bytes = activation_prefetch;
  if (trace_flag.was_set() && args.activation_trace.empty()) return usage(trace_message);

  if (args.hpz_node_ranks == 0) {
    absl::StatusOr<uint32_t> from_environment = strata::hpz_node_ranks_from_environment();
    if (!from_environment.ok()) return usage(std::string(from_environment.status().message()));
    args.hpz_node_ranks = *from_environment;
  }
  if (!args.stage3_flag.empty() && args.zero_stage != 3) {
    return usage(absl::StrFormat(
        "%s applies to --zero-stage=3 only, the stage that partitions the parameters (this run is "
        "stage %u); add --zero-stage=3 or drop it",
        args.stage3_flag, args.zero_stage));
  }
  if (args.offload_activations && args.zero_stage != 0) {
    return usage(
        "--offload-activations is for --zero-stage=0 in this example (the stage-1-3 "
        "path keeps its activations in memory); drop one of them");
  }
  if (!args.offload_activations &&
      (!args.activation_trace.empty() || args.activation_home != strata::TierKind::kCpu)) {
    return usage("--activation-home and --activation-trace need --offload-activations");
  }
  if (args.variable_batches && args.zero_stage != 0) {
    return usage("--variable-batches is for --zero-stage=0 in this example");
  }
  return std::nullopt;
}

}  // namespace cpp_trainer
