// Python arrays in host memory, in and out of the module, without numpy's C API.
//
// In (HostArray): any object that exports the buffer protocol (PEP 3118: numpy arrays,
// memoryview, array.array, bytes), else one that exports DLPack in host memory (torch tensors:
// detached first, and copied to the CPU with .cpu() when they are on a GPU). Out (HostBuffer):
// memory of the module's own exporting the buffer protocol, handed to Python as a numpy array
// (numpy.asarray, zero copy) when numpy imports, else as a memoryview.
//
// Why not pybind11's numpy header: it reads numpy's C structures with the layout of the numpy that
// pybind11 was written for, and Debian's pybind11 2.10 reads numpy 2's wrong (arrays came in as
// their first element repeated, dtypes misread). The buffer protocol and DLPack are stable
// across numpy 1.x and 2.x and torch; the CTest python.no_numpy_api keeps that header out.
//
// Nothing is converted behind the caller's back: a wrong element type, a strided layout or a
// wrong element count is an InvalidArgumentError that names the argument, what was given and
// what is needed. The one conversion is Float32Values' exact widening of float16 and bfloat16.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "names.h"

namespace strata::python {

// A read-only view of a Python object's host memory, valid while this object lives.
class HostArray {
 public:
  // `what` names the argument in errors ("initial_master"). InvalidArgumentError when `object`
  // exports neither the buffer protocol nor DLPack in host memory.
  HostArray(const pybind11::handle& object, std::string what);
  ~HostArray();
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;

  // Null when strata has no dtype for the elements (complex, uint16, big-endian, ...).
  const DType* dtype() const { return dtype_; }
  const std::string& type_name() const { return type_name_; }  // "float64", "complex64", ...
  const std::vector<int64_t>& shape() const { return shape_; }
  uint64_t count() const { return count_; }
  uint64_t nbytes() const { return count_ * itemsize_; }
  const void* data() const { return data_; }
  // Row-major without gaps (dimensions of one element may have any stride).
  bool contiguous() const { return contiguous_; }
  const std::string& what() const { return what_; }
  // "a float64 numpy.ndarray of shape (2, 5)".
  std::string description() const;

  // InvalidArgumentError naming the argument when the layout is not contiguous.
  void require_contiguous() const;

 private:
  void from_buffer(const pybind11::handle& object);
  void from_dlpack(const pybind11::handle& object);

  std::string what_;
  std::string object_type_;  // "numpy.ndarray", "torch.Tensor", "array.array"
  std::string type_name_;
  const DType* dtype_ = nullptr;
  std::vector<int64_t> shape_;
  uint64_t count_ = 0;
  uint64_t itemsize_ = 0;
  const void* data_ = nullptr;
  bool contiguous_ = true;
  std::unique_ptr<Py_buffer> view_;  // the buffer protocol's view, released by the destructor
  pybind11::object keep_;            // DLPack: the exporter and its capsule
  pybind11::object capsule_;
};

// `count` fp32 values given as an argument: float32 read in place, float16 and bfloat16 widened
// (exactly); any other element type, a strided layout or another element count raises
// InvalidArgumentError naming the argument (`count_of` says whose count it must be: "the
// parameter's").
class Float32Values {
 public:
  Float32Values(const pybind11::handle& object, std::string what, uint64_t count,
                const std::string& count_of);
  std::span<const float> span() const { return span_; }

 private:
  HostArray array_;
  std::vector<float> widened_;
  std::span<const float> span_;
};

// Memory of the module's own with a dtype and a shape (row-major), exported through the buffer
// protocol (strata._strata.HostBuffer).
class HostBuffer {
 public:
  HostBuffer(const DType& dtype, std::vector<int64_t> shape);
  void* data() { return bytes_.get(); }
  uint64_t nbytes() const { return nbytes_; }
  const DType& dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  friend void bind_host_array(pybind11::module_& m);
  DType dtype_;
  std::vector<int64_t> shape_;
  uint64_t nbytes_ = 0;
  std::unique_ptr<std::byte[]> bytes_;
};

// The buffer as a numpy array (zero copy) when numpy can be imported, else as a memoryview.
pybind11::object to_python(std::shared_ptr<HostBuffer> buffer);

// The buffer-protocol format character of a dtype ("f", "e", "q"...); none for bfloat16.
const char* buffer_format(const DType& dtype);

void bind_host_array(pybind11::module_& m);

}  // namespace strata::python
