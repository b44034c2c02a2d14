// The train-step workload's step itself (bench/train_step/train_step.cc runs it per policy): the
// simulated compute, one step through the store, and a policy's row from the store's counters
// around it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "bench/train_step/train_step.h"
#include "strata/activations/activation_stash.h"
#include "strata/store/tensor_store.h"
#include "strata/store/timeline.h"

namespace strata::bench {

struct StepCounters {
  StoreStats before;
  StoreStats after;
  double compute_seconds = 0;
  std::optional<ActivationStashStats> stash_before, stash_after;
  // --timeline: the step's span in its policy's timeline.
  int64_t timeline_start_ns = 0, timeline_end_ns = 0;
};

// One training step as step_plan() lays it out: for each layer of each pass, its tensors acquired
// on the GPU (read or write), the layer's simulated compute launched on `stream`, the tensors
// released, and (--sync-each-layer) the host waiting for the compute; then waits for the stream.
// With a stash, the activation accesses go to it instead (`stash` non-null, `activation_bytes`
// each): forward allocates and, after the compute is launched, offloads; backward loads and
// frees. With `timeline`, each layer (host track), its compute (compute track) and the host's
// wait for it go there.
absl::Status run_step(TensorStore& store, Device& device, Stream& stream,
                      const std::vector<TensorHandle>& tensors,
                      const std::vector<PlannedLayer>& plan, bool sync_each_layer,
                      const std::shared_ptr<std::atomic<int64_t>>& spent_ns, ActivationStash* stash,
                      uint64_t activation_bytes,
                      const std::shared_ptr<Timeline>& timeline = nullptr);

// The policy's row from the counters around its step.
TrainStepRun make_run(const char* policy, double seconds, const StepCounters& c);

}  // namespace strata::bench
