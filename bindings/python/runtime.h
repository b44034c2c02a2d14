// strata.Runtime: the C++ Runtime, the stream that carries the work of Python calls, and the
// consumers' streams Python named (wrapped once, by native handle, for the runtime's lifetime).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "names.h"
#include "strata/device/device.h"
#include "strata/runtime/runtime.h"
#include "strata/store/tensor_store.h"

namespace strata::python {

class PyRuntime {
 public:
  PyRuntime(std::unique_ptr<Runtime> runtime, std::unique_ptr<Stream> stream)
      : runtime_(std::move(runtime)), stream_(std::move(stream)) {}
  ~PyRuntime();

  Runtime& runtime() { return *runtime_; }
  TensorStore& store() { return runtime_->store(); }
  Device& device() { return runtime_->device(); }
  // strata's stream: acquisitions are ready on it (see acquisition.h).
  Stream& stream() { return *stream_; }
  bool cuda() const { return runtime_->config().backend == Backend::kCuda; }

  // The Stream for a consumer's native handle (a cudaStream_t, or a host stream's handle),
  // wrapped on first use and kept, so the store sees one Stream object per queue. GIL held.
  absl::StatusOr<Stream*> external_stream(uintptr_t native);
  // Drops the wrapper of a stream that is going away (a strata.Stream being destroyed).
  void forget_external_stream(uintptr_t native);

  // What Python recorded at create(): dtype and shape, by tensor name.
  struct Record {
    std::vector<int64_t> shape;
    DType dtype;
  };
  std::map<std::string, Record> records;  // guarded by the GIL

 private:
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Stream> stream_;  // destroyed before the runtime (see ~PyRuntime)
  std::map<uintptr_t, std::unique_ptr<Stream>> external_;  // guarded by the GIL
};

void bind_runtime(pybind11::module_& m);

}  // namespace strata::python
