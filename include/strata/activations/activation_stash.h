// ActivationStash: ZeRO-R's activation offload. The activations a trainer saves in forward for
// use in backward wait in the pinned CPU tier (or on NVMe) instead of the GPU, and come back into
// the GPU arena ahead of their use, in the order the previous step's backward used them (the
// forward order reversed until a step has been seen).
//
//   forward:   auto buf = stash.allocate(bytes, TierKind::kGpu, stream);  // an arena block
//              ...compute the activation into buf->data on `stream`...
//              stash.offload(buf->id, stream);       // it moves home behind the next layers
//   backward:  const void* a = *stash.load(id, stream);  // ready for work on `stream`
//              ...use it on `stream`...
//              stash.free(id, stream);               // its bytes go once that work is done
//
// allocate(bytes, TierKind::kCpu, ...) hands out pinned CPU-tier memory instead, for an
// activation the trainer copies out of memory it owns (the torch hooks copy torch's tensor
// there, device to host, on a side stream): no GPU bytes are held in forward.
//
// The GPU window. The stash's activations never hold more than `window_bytes` of the GPU tier
// at once: the ones being written (allocated in the GPU tier, not yet home), the ones brought
// back and not yet freed. allocate() and load() wait on the host for earlier offloads and frees
// to finish when the window is full, and fail with ResourceExhausted when waiting cannot help
// (the trainer itself holds the window). So the GPU tier's high-water mark stays at what the
// trainer keeps there (its model states) plus the window.
//
// Prefetch. Every load() brings back the activations the order uses next, up to
// `prefetch_bytes` ahead (never past the window). An activation whose use in backward comes
// within `prefetch_bytes` of backward's start (the last layers' activations) is kept in the GPU
// tier when it is offloaded rather than sent home and fetched straight back, or, written to the
// CPU tier, fetched back at once behind the rest of forward (`keep_tail`). The
// order is keyed by the save index within a step (the n-th allocate() since step_begin()), so
// variable sizes (sequence lengths) do not disturb it; a step whose loads came in another order
// replaces it at the next step_begin().
//
// Moves are stream-ordered: offload() and free() return without waiting for the device; a
// background thread moves activations home and destroys freed ones (the store waits there for
// the device work that used them), another brings prefetched ones back. Data safety is the store's:
// an activation's newest bytes are in at least one complete copy until free(); NVMe copies are
// checked by the swap space's XXH3 checksum of every stripe unit, and a mismatch fails load() with
// DataLoss naming the tensor.
//
// Errors name the activation and the fix: a full CPU tier or NVMe swap space at allocate() (the
// home copy is reserved there, so a later move home cannot fail for lack of room; allocate()
// first waits for the background destroys of freed activations, which give room back once the
// device work that used them is done), a window too small for what the trainer holds, a load
// of a freed activation. A failed background move is returned by the next call touching that
// activation, and by synchronize().
//
// Thread-safe: load/unload/free may come from other threads than allocate/offload (torch's
// autograd threads).
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "strata/device/device.h"
#include "strata/store/tensor_store.h"

namespace strata {

struct ActivationStashOptions {
  TierKind home = TierKind::kCpu;  // kCpu (pinned CPU tier) or kNvme: where activations wait
  // GPU-tier bytes the stash's activations may hold at once (see above).
  uint64_t window_bytes = uint64_t{256} << 20;
  // How far ahead of backward's loads activations are brought back; at most window_bytes.
  uint64_t prefetch_bytes = uint64_t{64} << 20;
  // Keep the activations backward uses first (within prefetch_bytes) in the GPU tier at
  // offload(), once the order is known, instead of a round trip home and back.
  bool keep_tail = true;
  // Record the GPU-tier lifetime of every activation (arena-replay's trace format): see
  // write_trace().
  bool record_trace = false;
  std::string name = "activation";  // prefix of the store tensors' names
};

using ActivationId = uint64_t;  // 0 is never an activation

struct ActivationStashStats {
  uint64_t steps = 0;
  uint64_t saved = 0;  // allocate() calls, all steps
  uint64_t saved_bytes = 0;
  uint64_t offloaded = 0;        // sent home (to the CPU tier or NVMe)
  uint64_t offloaded_bytes = 0;  // of which bytes
  uint64_t kept = 0;             // kept in the GPU tier at offload() (keep_tail)
  uint64_t loads = 0;
  uint64_t loads_prefetched = 0;  // a prefetch had started bringing it back
  uint64_t loads_on_demand = 0;   // fetched by load() itself
  uint64_t loads_kept = 0;     // there without a fetch: kept by keep_tail, or from an earlier load
  uint64_t prefetches = 0;     // prefetches issued
  uint64_t order_changes = 0;  // steps whose loads replaced the recorded order
  bool has_order = false;
  uint64_t live = 0;  // activations not yet freed
  uint64_t live_bytes = 0;
  uint64_t gpu_bytes = 0;       // GPU-tier bytes held by activations now (sizes rounded up as the
                                // arena rounds them)
  uint64_t gpu_peak_bytes = 0;  // the most gpu_bytes has been (at most window_bytes)
  uint64_t window_waits = 0;    // allocate()/load() calls that waited for room in the window
  uint64_t window_wait_ns = 0;  // host time they waited
  uint64_t room_waiters = 0;    // allocate()/load() calls waiting for room now
  uint64_t load_wait_ns = 0;    // host time load() waited for a move home to finish first
  // allocate() calls that found the home tier full and waited for the mover to destroy freed
  // activations (their device work not yet done) before trying again.
  uint64_t home_room_waits = 0;
  uint64_t errors = 0;  // failed background moves
};

class ActivationStash {
 public:
  // The store (and the device it was made with) must outlive the stash. InvalidArgument for a
  // bad option (the message names it), FailedPrecondition for home kNvme without an NVMe tier.
  static absl::StatusOr<std::unique_ptr<ActivationStash>> create(
      TensorStore& store, Device& device, ActivationStashOptions options = {});
  // Waits for the background moves and destroys every activation still held.
  ~ActivationStash();
  ActivationStash(const ActivationStash&) = delete;
  ActivationStash& operator=(const ActivationStash&) = delete;

  // Step boundaries: save indices restart at step_begin(), which also ends the previous step
  // (its loads become the order when they differ from it). step_end() is optional.
  void step_begin();
  void step_end();

  struct Buffer {
    ActivationId id = 0;
    void* data = nullptr;  // writable by work on `stream` (kGpu) or by the host at once (kCpu)
  };
  // A new activation of `bytes` in `tier` (kGpu or kCpu), for the trainer to write.
  absl::StatusOr<Buffer> allocate(uint64_t bytes, TierKind tier, Stream& stream);
  // Written, by work issued on `stream`: it goes home in the background (or stays, keep_tail).
  absl::Status offload(ActivationId id, Stream& stream);

  // The activation in the GPU tier, ready for work on `stream`, and the next ones in the order
  // prefetched. Each load() is given back by unload() or free(); load() again after unload()
  // is fine (a second backward with retain_graph).
  absl::StatusOr<const void*> load(ActivationId id, Stream& stream);
  // The work on `stream` that used the latest load() is issued.
  absl::Status unload(ActivationId id, Stream& stream);
  // Done with the activation: loads not yet unloaded are released on `stream`, and its bytes go
  // in every tier once the work issued there is done. An activation allocated and never
  // offloaded (an aborted forward) may be freed too.
  absl::Status free(ActivationId id, Stream& stream);

  // Waits until every offload, free and prefetch issued so far is done; the first background
  // error.
  absl::Status synchronize();

  ActivationStashStats stats() const;
  const ActivationStashOptions& options() const;
  // Writes the recorded GPU-tier lifetimes ("a <name> <bytes>" / "f <name>" lines, in the order
  // the stash counted them into and out of the window) for arena-replay. FailedPrecondition
  // without record_trace.
  absl::Status write_trace(const std::string& path) const;

  struct Impl;
  explicit ActivationStash(std::unique_ptr<Impl> impl);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
