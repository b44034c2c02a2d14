// offload-bench's flags that only --workload=train-step takes (docs/train-step.md).
#include "bench/train_step/train_step.h"
#include "cli.h"

namespace strata::bench {

std::vector<cli::Flag*> add_train_step_flags(cli::FlagSet& flags, TrainStepOptions* train,
                                             std::string* policies_text) {
  return {
      &flags.add_size("activation-bytes", &train->activation_bytes,
                      "train-step: bytes of each layer's saved activation, written in forward and "
                      "read in backward (a multiple of 4KiB; 0: none)"),
      &flags.add_double("compute-ms", &train->compute_ms,
                        "train-step: simulated compute per layer of forward and of backward, in "
                        "milliseconds"),
      &flags.add_bool("optimizer", &train->optimizer,
                      "train-step: after backward, the optimizer pass over the layers in forward "
                      "order (gradient read, weight updated); --optimizer=off: forward and "
                      "backward only, no gradients (a palindrome: LRU evicts as Belady does)"),
      &flags.add_double("optimizer-ms", &train->optimizer_ms,
                        "train-step: simulated compute per layer of the optimizer pass, in "
                        "milliseconds"),
      &flags.add_uint64("arena-layers", &train->arena_layers,
                        "train-step: layers (all of a layer's tensors) the GPU arena holds"),
      &flags.add_enum("home", &train->home, {"nvme", "cpu"},
                      "train-step: the layers' home tier (nvme uses STRATA_NVME_PATHS or a "
                      "temporary directory, as the NVMe paths do)"),
      &flags.add_double("link-gbps", &train->link_gbps,
                        "train-step: HostDevice H2D/D2H throttle in GB/s (below PCIe, so the link "
                        "limits the step); 0 = unthrottled; ignored on CUDA"),
      &flags.add_bool("sync-each-layer", &train->sync_each_layer,
                      "train-step: the host waits for each layer's compute before the next "
                      "acquire (no run-ahead: only prefetching hides transfers); "
                      "--sync-each-layer=off lets the host run ahead"),
      &flags.add_bool("discard", &train->discard,
                      "train-step: discard the activation after backward's read and the gradient "
                      "after the optimizer's (TensorStore::discard: no write-back of dead bytes); "
                      "--discard=off keeps them"),
      &flags.add_bool("early-writeback", &train->early_writeback,
                      "train-step: the store writes home ahead of need the written copies the "
                      "coming room will evict (TensorStoreOptions::early_writeback_bytes); "
                      "--early-writeback=off: when the room is needed"),
      &flags.add_string("policies", policies_text,
                        "train-step: comma-separated policies to run, in this order, each in a "
                        "fresh runtime: belady (prefetch + Belady eviction), lru (prefetch + LRU), "
                        "on-demand (no prefetch, Belady eviction)"),
      &flags.add_enum("activations", &train->activations, {"store", "stash"},
                      "train-step: saved activations as store tensors paged like the weights, or "
                      "through an ActivationStash (docs/activations.md)"),
      &flags.add_size("activation-window-bytes", &train->activation_window_bytes,
                      "train-step, stash: GPU bytes activations may hold (0: 4 activations)"),
      &flags.add_string("timeline", &train->timeline,
                        "train-step: write every policy's measured steps to this file as a Chrome "
                        "trace (chrome://tracing, Perfetto: each move, wait and layer's compute) "
                        "and report where each median step's time went"),
      &flags.add_size("activation-prefetch-bytes", &train->activation_prefetch_bytes,
                      "train-step, stash: how far ahead they come back (0: 2 activations)"),
  };
}

}  // namespace strata::bench
