// strata.Stream, and what a `stream` argument names in the DLPack stream protocol.
//
// A consumer names its stream to __dlpack__(stream=...) and release(stream=...):
//   None        the consumer's default: on CUDA the legacy default stream (DLPack's rule); on the
//               host backend the host itself (a CPU consumer reads at once).
//   -1          no synchronization: the consumer orders its work itself.
//   1, 2        CUDA's legacy and per-thread default streams (on the host backend: the host).
//   an int      a cudaStream_t (CUDA) or a strata.Stream's handle (host backend; host streams
//               have no other name). 0 is refused on CUDA, as DLPack asks: say 1 or 2.
//   a strata.Stream, or an object with a `cuda_stream` attribute (torch.cuda.Stream)
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

#include "runtime.h"

namespace strata::python {

class PyStream {
 public:
  PyStream(std::shared_ptr<PyRuntime> rt, std::unique_ptr<Stream> stream, uintptr_t handle)
      : rt_(std::move(rt)), stream_(std::move(stream)), handle_(handle) {}
  ~PyStream();

  PyRuntime& runtime() const { return *rt_; }
  const std::shared_ptr<PyRuntime>& runtime_ptr() const { return rt_; }
  Stream& stream() const { return *stream_; }
  uintptr_t handle() const { return handle_; }

 private:
  std::shared_ptr<PyRuntime> rt_;  // outlives stream_
  std::unique_ptr<Stream> stream_;
  uintptr_t handle_;
};

std::shared_ptr<PyStream> create_stream(const std::shared_ptr<PyRuntime>& rt);

struct StreamChoice {
  enum Kind { kDefault, kNoSync, kHandle };
  Kind kind = kDefault;
  uintptr_t handle = 0;  // kHandle: the native handle
};
// `what` names the call in error messages ("__dlpack__", "release").
StreamChoice parse_stream(PyRuntime& rt, const pybind11::handle& stream, const char* what);

void bind_stream(pybind11::module_& m);

}  // namespace strata::python
