// The train-step workload's step as data, and an offline paging model of it.
//
// One plan drives both the measured step (bench/train_step.cc) and the model, so that what the
// model says a policy must move is about the very trace the store records and replays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::bench {

struct TrainStepOptions;

// Which of a layer's tensors: its weight, its saved activation, its gradient.
enum class LayerTensor { kWeight, kActivation, kGradient };

struct PlannedAccess {
  uint64_t tensor = 0;  // index into the tensors create_layers() made (layer-major)
  bool write = false;   // acquired with AccessMode::kWrite
  // Every byte is written before any is read (AccessMode::kOverwrite): the store fetches
  // nothing for it, and the model counts no fetch.
  bool overwrite = false;
};

// One layer of one pass: its tensors acquired on the GPU in this order, the simulated compute,
// then all released.
struct PlannedLayer {
  const char* pass = "";  // "forward", "backward" or "optimizer"
  std::vector<PlannedAccess> accesses;
  double compute_ms = 0;
};

// The tensors of one layer, in creation order: the weight, the activation (--activation-bytes
// > 0), the gradient (--optimizer).
std::vector<LayerTensor> layer_tensors(const TrainStepOptions& options);
uint64_t tensor_bytes(const TrainStepOptions& options, LayerTensor kind);

// A training step: forward L0..Ln (weight read, activation written), backward Ln..L0
// (activation read, weight read, gradient written), then with --optimizer the optimizer pass
// L0..Ln in forward order (gradient read, weight written) before the next step's forward. The
// activation (made by forward) and the gradient (backward's only write of it in a step) are
// overwrites; the weight's update reads the weight it replaces, so it is a kWrite.
std::vector<PlannedLayer> step_plan(const TrainStepOptions& options);

// What an offline pager moves in a steady-state step of the plan repeated forever, with the
// arena a pool of `capacity` bytes (no fragmentation, no room kept for prefetches in flight):
// a miss fetches the tensor (an overwrite only takes room: no miss); evicting a copy written
// since its fetch writes it back.
struct PagingModel {
  uint64_t misses = 0;
  uint64_t fetched_bytes = 0;       // into the GPU
  uint64_t written_back_bytes = 0;  // out of the GPU
};
// belady: evict the resident copy whose next use is furthest ahead (Belady's MIN); otherwise
// the least recently used. `footprint[i]` is tensor i's size in the arena.
PagingModel model_paging(const std::vector<PlannedLayer>& plan,
                         const std::vector<uint64_t>& footprint, uint64_t capacity, bool belady);

}  // namespace strata::bench
