// The train-step workload's step as data, and an offline paging model of it.
//
// One plan drives both the measured step (bench/train_step/train_step.cc) and the model, so that
// what the model says a policy must move is about the very trace the store records and replays.
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
  // The step's last read of bytes dead after it (--discard): discarded once released, so the
  // model counts no write-back for it.
  bool last_use = false;
};

// One layer of one pass: its tensors acquired on the GPU in this order, the simulated compute,
// then all released.
struct PlannedLayer {
  const char* pass = "";  // "forward", "backward" or "optimizer"
  std::vector<PlannedAccess> accesses;
  double compute_ms = 0;
  uint64_t layer = 0;  // the model's layer (backward runs them from the last)
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

// A lower bound on the step that counts the arena's capacity across passes, for any policy,
// prefetching or not, with or without --sync-each-layer. For each cut k = 0..n-1 before planned
// layer k:
//
//   compute_before(k) + max(compute_after(k), max(0, fetch_after(k) - capacity) / link)
//
// compute_before/after: the planned compute of layers [0, k) and [k, n); fetch_after(k): the
// summed footprint of the distinct tensors whose first access in layers [k, n) is not an
// overwrite (a kWrite is fetched first like a read).
//
// Proof. The layers' compute runs on one stream in plan order, so layer k's starts at some t_k
// >= compute_before(k) after the step began, and the step ends no earlier than t_k +
// compute_after(k). Each tensor counted in fetch_after(k) is read (or updated) by a layer >= k
// before anything writes it there, so its bytes are either in the arena at t_k or reach it over
// the link after t_k (they cannot be made on the GPU). At t_k the arena holds at most `capacity`
// bytes, whatever the previous step left there and whatever is in flight (a copy's destination
// is allocated in the arena), so at least fetch_after(k) - capacity bytes cross after t_k, at
// `link_bytes_per_second` at most, and the step ends no earlier than t_k + that time. The bound
// is the largest such figure over k (k = 0 is max(compute, (reads - capacity) / link), weaker
// than TrainStepBound's max(compute, Belady's fetches / link); the reported arena bound is the
// larger of the two).
//
// Not counted (each only makes the true minimum larger): write-backs (the link's other
// direction), refetches of copies evicted after t_k, fragmentation, time before layer 0's
// compute. `footprint` already has the arena's rounding to its granularity. It assumes the link
// carries at most `link_bytes_per_second` in all, as TrainStepBound does, and that `capacity` is
// everything the GPU tier can hold: with --activations=stash, the stash's activations are GPU
// tier tensors too (its window is a soft reservation that other tensors may fill), so the plan
// there must keep the activations' accesses and the capacity must be the whole arena, not the
// paging model's arena beside the window. The same argument one hop further back bounds the
// NVMe read: bytes that are neither in the arena nor in the CPU tier at t_k (capacity = both).
struct ArenaBound {
  double seconds = 0;  // the largest figure over the cuts; 0 for an empty plan
  size_t cut = 0;      // the binding cut: the first layer after it (the earliest on a tie)
  double compute_before_seconds = 0;
  double compute_after_seconds = 0;
  uint64_t fetch_after_bytes = 0;  // fetch_after(cut)
  uint64_t cross_after_bytes = 0;  // max(0, fetch_after(cut) - capacity)
  std::string where;               // the layer after the cut, e.g. "optimizer 0"
};
ArenaBound arena_bound(const std::vector<PlannedLayer>& plan,
                       const std::vector<uint64_t>& footprint, uint64_t capacity,
                       double link_bytes_per_second);

}  // namespace strata::bench
