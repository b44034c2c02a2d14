// strata.Tensor: a tensor registered with a Runtime's store, with the shape and dtype Python
// gave it (the store itself knows bytes only).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "names.h"
#include "runtime.h"

namespace strata::python {

class PyTensor {
 public:
  PyTensor(std::shared_ptr<PyRuntime> rt_, TensorHandle handle_, std::string name_,
           std::vector<int64_t> shape_, DType dtype_, uint64_t bytes_, TierKind home_)
      : rt(std::move(rt_)),
        handle(handle_),
        name(std::move(name_)),
        shape(std::move(shape_)),
        dtype(std::move(dtype_)),
        bytes(bytes_),
        home(home_) {}

  void check_alive() const;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  std::shared_ptr<PyRuntime> rt;
  TensorHandle handle;
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
  uint64_t bytes;
  TierKind home;
  bool destroyed = false;
  // A ZeroEngine parameter (engine.acquire_param()): `handle` is its flat group tensor, whose
  // bytes the engine owns; acquire, prefetch, evict and destroy are refused.
  bool engine_view = false;
  int acquired = 0;  // live Acquisitions made through this object
};

std::shared_ptr<PyTensor> create_tensor(const std::shared_ptr<PyRuntime>& rt,
                                        const std::string& name, const pybind11::object& shape,
                                        const pybind11::object& dtype, const std::string& home);
std::shared_ptr<PyTensor> find_tensor(const std::shared_ptr<PyRuntime>& rt,
                                      const std::string& name);

void bind_tensor(pybind11::module_& m);

}  // namespace strata::python
