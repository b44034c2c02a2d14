// A Communicator that forwards every call to another one and adds up how long its all-reduces
// took, each from its issue to the return of its first wait() or synchronize(). The ranked
// optimizer workload hands it to the ZeroEngine, whose only all-reduce is the gradient
// statistics' inside the optimizer's step (ZeroStats counts it in last_optimizer_ns), so that
// the bench can report it as communication.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "strata/comm/communicator.h"

namespace strata::bench {

class AllReduceTimer final : public Communicator {
 public:
  // `inner` must outlive this.
  explicit AllReduceTimer(Communicator& inner) : inner_(inner) {}

  // Nanoseconds of every all-reduce waited for so far.
  uint64_t all_reduce_ns() const { return ns_->load(); }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  CommBackendKind backend() const override { return inner_.backend(); }
  CommStats stats() const override { return inner_.stats(); }
  std::string description() const override { return inner_.description(); }

  using Communicator::all_gather;
  using Communicator::reduce_scatter;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_gather(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type,
      const CollectiveOptions& options) override {
    return inner_.all_gather(send, recv, counts, type, options);
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> reduce_scatter(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type, ReduceOp op,
      const CollectiveOptions& options) override {
    return inner_.reduce_scatter(send, recv, counts, type, op, options);
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_reduce(
      const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
      const CollectiveOptions& options) override;
  absl::StatusOr<std::unique_ptr<CollectiveWork>> broadcast(
      void* data, uint64_t count, DataType type, int root,
      const CollectiveOptions& options) override {
    return inner_.broadcast(data, count, type, root, options);
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> barrier(
      const CollectiveOptions& options) override {
    return inner_.barrier(options);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> split(int color, int key) override {
    return inner_.split(color, key);
  }

 private:
  Communicator& inner_;
  // Shared with the works handed out, which may outlive this.
  std::shared_ptr<std::atomic<uint64_t>> ns_ = std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace strata::bench
