// testing::device_buffers_only (strata/testing/device_buffers_only.h): a communicator that
// refuses host memory as NCCL's buffers would be refused, over a working one.
#include "strata/testing/device_buffers_only.h"

#include <absl/status/status.h>
#include <absl/strings/str_format.h>

#include <initializer_list>
#include <string>
#include <utility>

#include "strata/base/text.h"
#include "strata/device/device.h"

namespace strata::testing {
namespace {

using text::cat;

class DeviceBuffersOnly final : public Communicator {
 public:
  DeviceBuffersOnly(std::unique_ptr<Communicator> inner, Device& device)
      : inner_(std::move(inner)), device_(device) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  CommBackendKind backend() const override { return inner_->backend(); }
  bool needs_device_buffers() const override { return true; }
  CommStats stats() const override { return inner_->stats(); }
  std::string description() const override {
    return cat(inner_->description(), " (device buffers only: testing)");
  }

  using Communicator::all_gather;
  using Communicator::reduce_scatter;

  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_gather(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type,
      const CollectiveOptions& options) override {
    if (absl::Status s = check("all_gather", {send, recv}); !s.ok()) return s;
    return inner_->all_gather(send, recv, counts, type, options);
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> reduce_scatter(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type, ReduceOp op,
      const CollectiveOptions& options) override {
    if (absl::Status s = check("reduce_scatter", {send, recv}); !s.ok()) return s;
    return inner_->reduce_scatter(send, recv, counts, type, op, options);
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_reduce(
      const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
      const CollectiveOptions& options) override {
    if (absl::Status s = check("all_reduce", {send, recv}); !s.ok()) return s;
    return inner_->all_reduce(send, recv, count, type, op, options);
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> broadcast(
      void* data, uint64_t count, DataType type, int root,
      const CollectiveOptions& options) override {
    if (absl::Status s = check("broadcast", {data}); !s.ok()) return s;
    return inner_->broadcast(data, count, type, root, options);
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> barrier(
      const CollectiveOptions& options) override {
    return inner_->barrier(options);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<Communicator>> group = inner_->split(color, key);
    if (!group.ok()) return group.status();
    return device_buffers_only(*std::move(group), device_);
  }

 private:
  absl::Status check(std::string_view op, std::initializer_list<const void*> buffers) {
    for (const void* p : buffers) {
      absl::StatusOr<MemoryKind> kind = device_.memory_kind(p);
      if (!kind.ok()) return kind.status();
      if (*kind != MemoryKind::kDevice) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: buffer %p is %s memory; this communicator moves %s's device memory only (as "
            "NCCL does; a testing hook)",
            op, p, to_string(*kind), device_.description()));
      }
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Communicator> inner_;
  Device& device_;
};

}  // namespace

std::unique_ptr<Communicator> device_buffers_only(std::unique_ptr<Communicator> comm,
                                                  Device& device) {
  return std::make_unique<DeviceBuffersOnly>(std::move(comm), device);
}

}  // namespace strata::testing
