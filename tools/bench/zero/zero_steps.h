// One rank's part of --workload=zero (bench/zero/zero_workload.h): the layout of the synthetic
// model, and the engine with its training steps, each timed and counted.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <vector>

#include "bench/fresh_pieces.h"
#include "bench/zero/zero_baselines.h"
#include "bench/zero/zero_workload.h"
#include "strata/comm/communicator.h"
#include "strata/runtime/runtime.h"
#include "strata/zero/zero_engine.h"

namespace strata::bench {

inline constexpr uint64_t kZero3ParamBytes = 2;  // fp16 parameters and gradients
inline constexpr uint32_t kZero3Alignment = 64;  // ZeroOptions' default

// The layout ZeroLayout makes of one layer (one flat group): padded to ranks × alignment.
struct Zero3Plan {
  uint64_t layer_params = 0;
  uint64_t padded = 0;
  uint64_t shard = 0;
  uint64_t gathered_bytes = 0;  // one layer gathered
  uint64_t prefetch_bytes = 0;
  uint64_t max_live_bytes = 0;
  uint64_t reuse_window_bytes = 0;
  uint64_t model_shard_bytes = 0;  // this rank's shard of every layer
};

Zero3Plan plan_of(const Zero3Options& options, int ranks);

// What one rank measured: its timed steps and its model states at the end.
struct Zero3RankRecord {
  std::vector<Zero3Sample> samples;
  ZeroMemory memory;
  FreshPieces fresh;  // CPU-tier pieces the timed steps pinned
};

// This rank's engine over the runtime and communicator (every rank calls it: collectives): one
// warm-up step and --steps timed ones. `beside_engine` runs with the engine created, before the
// warm-up step and after the last one (the raw collectives: see run_zero_workload).
absl::StatusOr<Zero3RankRecord> run_zero3_steps(const Zero3Options& options, const Zero3Plan& plan,
                                                Runtime& runtime, Communicator& comm,
                                                HostCompute& compute, uint64_t compute_elements,
                                                const std::function<absl::Status()>& beside_engine,
                                                std::ostream& human);

}  // namespace strata::bench
