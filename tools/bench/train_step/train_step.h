// offload-bench --workload=train-step: a synthetic transformer training step through the
// TensorStore, timed against the overlap bound, once per policy.
//
// L layers, each an S-byte weight, a smaller saved activation and an S-byte gradient, homed on
// NVMe or in the pinned CPU tier; a step acquires them on the GPU in the order of a training step
// (bench/train_step/train_step_plan.h: forward 0..L-1, backward L-1..0, the optimizer pass 0..L-1),
// with a simulated compute time per layer and pass enqueued on the compute stream, and a GPU arena
// that holds only a fraction of the layers. Each policy (prefetch + Belady, prefetch + LRU,
// on-demand) runs in a fresh Runtime. See docs/train-step.md.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/train_step/train_step_plan.h"
#include "bench/train_step/train_step_timeline.h"
#include "cli.h"
#include "strata/config/config.h"
#include "strata/device/device.h"

namespace strata::bench {

struct TrainStepOptions {
  uint64_t layers = 16;
  uint64_t layer_bytes = uint64_t{8} << 20;       // each layer's weight
  uint64_t activation_bytes = uint64_t{2} << 20;  // each layer's saved activation (0: none)
  double compute_ms = 4;                          // per layer and pass (forward and backward each)
  uint64_t arena_layers = 4;  // layers (weight + activation) the GPU arena holds
  std::string home = "nvme";  // "nvme" or "cpu"
  // HostDevice H2D and D2H throttle, 1e9 bytes/s; 0: unthrottled. Slower than PCIe so that the
  // link, not this machine's memcpy, limits the step and the policies differ.
  double link_gbps = 3;
  uint64_t steps = 5;  // measured steps per policy, after one warm-up step
  // The optimizer pass after backward: the gradient written in backward and the weight, layer
  // by layer in forward order, the weight updated (an optimizer step on the GPU's copies). It
  // makes the step's reuse not a palindrome: the pass ends where the next forward does not
  // begin, LRU's worst case. false: forward and backward only (no gradients).
  bool optimizer = true;
  double optimizer_ms = 1;  // simulated compute per layer of the optimizer pass
  // The policies to run, in this order (each at most once): belady, lru, on-demand.
  std::vector<std::string> policies = {"belady", "lru", "on-demand"};
  // The host waits for each layer's compute before acquiring the next, as a trainer that reads
  // a layer's results on the host does. Without it the host runs ahead of the compute stream by
  // up to arena-layers layers, and that run-ahead alone already fetches ahead of need.
  // On by default: with run-ahead, an on-demand fetch is issued as early as a prefetch could be
  // and the policies cannot be told apart (docs/train-step.md).
  bool sync_each_layer = true;
  // The step's last read of bytes that are dead after it (the saved activation once backward has
  // read it, the gradient once the optimizer has) is followed by TensorStore::discard, as a
  // trainer frees them: their copies then go without a write-back. false: kept (written back
  // when evicted, as bytes the store must not lose).
  bool discard = true;
  // The store's early write-back (TensorStoreOptions::early_writeback_bytes, its default);
  // false: off, so that a written copy's write-back starts when its room is needed.
  bool early_writeback = true;
  // How the saved activations travel. "store": store tensors homed on --home, acquired and
  // paged by the store's scheduler like the weights. "stash": an ActivationStash
  // (docs/activations.md): written into the GPU arena in forward, sent home behind the next
  // layers, brought back along the recorded backward order, at most the window's bytes at once.
  std::string activations = "store";
  uint64_t activation_window_bytes = 0;    // stash: 0 is 4 activations
  uint64_t activation_prefetch_bytes = 0;  // stash: 0 is 2 activations (at most the window)
  // --timeline=FILE: every policy's measured steps as a Chrome trace
  // (bench/train_step/train_step_timeline.h) and, in the report, where its median step's time went.
  // Empty: not recorded.
  std::string timeline;
};

// The stash's window and prefetch distance after the defaults (0) are applied.
uint64_t stash_window_bytes(const TrainStepOptions& options);
uint64_t stash_prefetch_bytes(const TrainStepOptions& options);

// A usage error in `options` (the message names the flag), or nullopt.
std::optional<std::string> validate(const TrainStepOptions& options);

// What the step could at best take: compute and transfers fully overlapped.
struct TrainStepBound {
  double compute_seconds = 0;   // L * (2 * compute + optimizer compute)
  uint64_t transfer_bytes = 0;  // bytes that must cross the slowest link per step: the model's
                                // Belady fetches
  uint64_t arena_bytes = 0;     // the arena's room for blocks (the model's capacity)
  PagingModel belady;           // the offline paging model of the step (train_step_plan.h)
  PagingModel lru;
  double h2d_bytes_per_second = 0;
  std::optional<double> nvme_bytes_per_second;  // home=nvme only
  double link_bytes_per_second = 0;             // the slower of the two
  // --activations=stash: the activation bytes that cross the link each way per step (out in
  // forward, back in backward; keep_tail's kept ones stay), and what leaves the GPU in all
  // (the model's write-backs plus those): the link is full duplex, so the busier direction
  // bounds the step.
  uint64_t activation_transfer_bytes = 0;
  uint64_t d2h_bytes = 0;
  double transfer_seconds() const;
  double seconds() const;  // max(compute, transfer)
  // The arena-aware lower bound's binding cut (train_step_plan.h, arena_bound): over the H2D
  // link with the arena's capacity, or for home=nvme over the NVMe read with the arena's and the
  // CPU tier's, whichever is larger. `seconds()` ignores the arena's capacity across passes and
  // can be out of any schedule's reach; arena_seconds() is the larger of the two.
  ArenaBound arena;
  std::string arena_link = "H2D";  // or "NVMe read"
  double arena_link_bytes_per_second = 0;
  uint64_t arena_capacity_bytes = 0;  // the capacity the binding cut used
  double arena_seconds() const;
};

struct TrainStepRun {
  std::string policy;  // "belady", "lru" or "on-demand"
  // The median measured step (the lower middle one for an even --steps); every figure below is
  // that step's, so a row is one consistent step.
  double step_seconds = 0;
  double ratio_to_bound = 0;
  double ratio_to_arena_bound = 0;  // step / TrainStepBound::arena_seconds()
  double stall_seconds = 0;         // StoreStats::stall_ns during the step
  uint64_t bytes_moved = 0;         // every tier-to-tier move during the step
  uint64_t bytes_to_gpu = 0;        // of which into the GPU tier (fetches and prefetches)
  uint64_t bytes_from_gpu = 0;      // of which out of the GPU tier (write-backs of evicted copies)
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;
  uint64_t prefetches_late = 0;
  uint64_t prefetches_wasted = 0;
  uint64_t prefetches_failed = 0;
  double prefetch_accuracy = 0;  // used / issued during the step; 0 when none was issued
  // The store's early write-backs during the step (StoreStats: issued, used, wasted) and its
  // discards (--discard).
  uint64_t early_writebacks = 0, early_writebacks_used = 0, early_writebacks_wasted = 0;
  uint64_t discards = 0;
  double compute_seconds = 0;  // what the simulated compute itself took during the step
  // Mean host time per move during the step (MoveStats::ns / moves): for NVMe reads the read
  // itself, so a slow swap file shows here; 0 when nothing moved.
  double seconds_per_move = 0;
  // The same for the moves into the GPU tier (fetches) and out of it (write-backs): a write-back
  // to NVMe is a synchronous write, so a policy that fetches less has a higher mean per move.
  double seconds_per_fetch = 0;
  double seconds_per_write_back = 0;
  std::vector<double> all_step_seconds;  // every measured step, in order
  uint64_t gpu_tier_peak_bytes = 0;      // the GPU tier's high-water mark during the step
  // --activations=stash: the stash's counters during the step.
  struct Stash {
    uint64_t loads = 0, loads_prefetched = 0, loads_kept = 0, loads_on_demand = 0;
    uint64_t bytes_out = 0;  // sent home
    uint64_t window_waits = 0;
    double window_wait_seconds = 0;
    uint64_t gpu_peak_bytes = 0;  // since the stash was made
  };
  std::optional<Stash> stash;
  std::optional<StepTimelineSummary> timeline;  // --timeline: the median step's
};

struct TrainStepReport {
  TrainStepOptions options;
  ResolvedConfig config;  // the first policy run's (every run uses the same configuration)
  std::string device;     // the device's description
  std::string engine;     // the swap space's I/O engine, or "none" for home=cpu
  std::string engine_reason;
  TrainStepBound bound;
  std::vector<TrainStepRun> runs;
  std::vector<std::string> notes;  // footer lines: how the compute is simulated, warnings
};

// The device a run uses: on the host backend a HostDevice throttled to --link-gbps in both
// directions; on CUDA the configured GPU (the flag does not apply).
absl::StatusOr<std::unique_ptr<Device>> make_train_step_device(const TrainStepOptions& options,
                                                               const ResolvedConfig& config);

// Runs the workload: the link measurements, then one Runtime per policy. `base` is the
// configuration from the environment; its sizes are overridden to fit the workload. `nvme_paths`
// (home=nvme) are the directories for the swap space. Progress lines go to `human`.
absl::StatusOr<TrainStepReport> run_train_step(const TrainStepOptions& options, const Config& base,
                                               const std::vector<std::string>& nvme_paths,
                                               std::ostream& human);

void print_train_step(const TrainStepReport& report, std::ostream& out);

// Adds the flags only this workload takes (--activation-bytes ... --activation-prefetch-bytes;
// --layers, --layer-bytes and --steps are shared with --workload=zero), writing into `train`
// and `policies_text` (--policies, parsed by the caller); returns them.
std::vector<cli::Flag*> add_train_step_flags(cli::FlagSet& flags, TrainStepOptions* train,
                                             std::string* policies_text);
// The value of the "train_step" key of offload-bench's JSON document.
nlohmann::ordered_json train_step_json(const TrainStepReport& report);

}  // namespace strata::bench
