#include "host_array.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string_view>
#include <utility>

#include "dlpack.h"
#include "errors.h"
#include "float16.h"

namespace py = pybind11;

namespace strata::python {
namespace {

const DType* find_dtype(uint8_t code, uint32_t bits) {
  for (const DType& d : dtypes()) {
    if (d.dl.code == code && d.dl.bits == bits && d.dl.lanes == 1) return &d;
  }
  return nullptr;
}

std::string type_name_of(uint8_t code, uint32_t bits, uint32_t lanes) {
  std::string name;
  switch (code) {
    case kDLInt:
      name = "int" + std::to_string(bits);
      break;
    case kDLUInt:
      name = "uint" + std::to_string(bits);
      break;
    case kDLFloat:
      name = "float" + std::to_string(bits);
      break;
    case kDLBfloat:
      name = "bfloat" + std::to_string(bits);
      break;
    case kDLComplex:
      name = "complex" + std::to_string(bits);
      break;
    case kDLBool:
      name = "bool";
      break;
    default:
      name = "DLPack type code " + std::to_string(code) + " of " + std::to_string(bits) + " bits";
  }
  if (lanes != 1) name += " x" + std::to_string(lanes);
  return name;
}

// The element type of a buffer-protocol format (struct module syntax) of `itemsize` bytes.
std::pair<const DType*, std::string> element_of_format(std::string_view format, size_t itemsize) {
  const std::string whole(format);
  bool swapped = false;
  if (!format.empty() && std::string_view("@=<>!").find(format[0]) != std::string_view::npos) {
    const bool big = format[0] == '>' || format[0] == '!';
    const bool little = format[0] == '<';
    swapped = (big && std::endian::native == std::endian::little) ||
              (little && std::endian::native == std::endian::big);
    format.remove_prefix(1);
  }
  const auto bits = static_cast<uint32_t>(itemsize * 8);
  uint8_t code = 0;
  if (format == "Zf" || format == "Zd") {
    code = kDLComplex;
  } else if (format.size() != 1) {
    return {nullptr, "format '" + whole + "'"};
  } else if (std::string_view("efd").find(format[0]) != std::string_view::npos) {
    code = kDLFloat;
  } else if (std::string_view("bhilqn").find(format[0]) != std::string_view::npos) {
    code = kDLInt;
  } else if (std::string_view("BHILQN").find(format[0]) != std::string_view::npos) {
    code = kDLUInt;
  } else if (format[0] == '?') {
    code = kDLBool;
  } else {
    return {nullptr, "format '" + whole + "'"};
  }
  std::string name = type_name_of(code, bits, 1);
  if (swapped && itemsize > 1) {
    return {nullptr,
            (std::endian::native == std::endian::little ? "big-endian " : "little-endian ") + name};
  }
  return {find_dtype(code, bits), name};
}

std::string python_type_name(const py::handle& object) {
  const py::handle type = reinterpret_cast<PyObject*>(Py_TYPE(object.ptr()));
  const auto name = py::str(type.attr("__qualname__")).cast<std::string>();
  const auto module = py::str(type.attr("__module__")).cast<std::string>();
  return module == "builtins" ? name : module + "." + name;
}

bool row_major(const std::vector<int64_t>& shape, const int64_t* strides, int64_t unit) {
  if (strides == nullptr) return true;
  for (int64_t d : shape) {
    if (d == 0) return true;  // no elements: no layout
  }
  int64_t expected = unit;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] > 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

HostArray::HostArray(const py::handle& object, std::string what)
    : what_(std::move(what)), object_type_(python_type_name(object)) {
  if (PyObject_CheckBuffer(object.ptr()) != 0) {
    from_buffer(object);
  } else if (py::hasattr(object, "__dlpack__")) {
    from_dlpack(object);
  } else {
    raise(absl::StatusCode::kInvalidArgument,
          what_ + ": got a " + object_type_ +
              "; need an array in host memory that exports the buffer protocol or DLPack (a "
              "numpy array, array.array, memoryview or torch CPU tensor)");
  }
  count_ = 1;
  for (int64_t d : shape_) count_ *= static_cast<uint64_t>(d);
}

HostArray::~HostArray() {
  if (view_) PyBuffer_Release(view_.get());
}

void HostArray::from_buffer(const py::handle& object) {
  auto view = std::make_unique<Py_buffer>();
  // Strides and format, read-only: the layout is checked here, so that a strided array is an
  // error that says so rather than the exporter's BufferError.
  if (PyObject_GetBuffer(object.ptr(), view.get(), PyBUF_RECORDS_RO) != 0) {
    py::error_already_set error;
    raise(absl::StatusCode::kInvalidArgument,
          what_ + ": got a " + object_type_ + " whose buffer cannot be read (" + error.what() +
              "); need an array in host memory with a row-major layout");
  }
  view_ = std::move(view);
  const Py_buffer& v = *view_;
  itemsize_ = static_cast<uint64_t>(v.itemsize);
  for (int i = 0; i < v.ndim; ++i) shape_.push_back(static_cast<int64_t>(v.shape[i]));
  std::vector<int64_t> strides;
  if (v.strides != nullptr) {
    for (int i = 0; i < v.ndim; ++i) strides.push_back(static_cast<int64_t>(v.strides[i]));
  }
  contiguous_ = row_major(shape_, v.strides != nullptr ? strides.data() : nullptr,
                          static_cast<int64_t>(v.itemsize));
  data_ = v.buf;
  auto [dtype, name] = element_of_format(v.format != nullptr ? v.format : "B", itemsize_);
  dtype_ = dtype;
  type_name_ = std::move(name);
}

void HostArray::from_dlpack(const py::handle& object) {
  py::object source = py::reinterpret_borrow<py::object>(object);
  // torch: a tensor that requires grad exports only once detached (no copy).
  if (py::hasattr(source, "detach")) source = source.attr("detach")();
  auto device = source.attr("__dlpack_device__")().cast<py::tuple>();
  auto type = device[0].cast<int>();
  if (type != kDLCPU && type != kDLCUDAHost && py::hasattr(source, "cpu")) {
    source = source.attr("cpu")();  // torch on a GPU: a copy in host memory
    device = source.attr("__dlpack_device__")().cast<py::tuple>();
    type = device[0].cast<int>();
  }
  if (type != kDLCPU && type != kDLCUDAHost) {
    raise(absl::StatusCode::kInvalidArgument,
          what_ + ": got a " + object_type_ + " in device memory (DLPack device type " +
              std::to_string(type) + ", device " + py::str(device[1]).cast<std::string>() +
              "); need an array in host memory: copy it to the host first");
  }
  capsule_ = source.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
  if (managed == nullptr) {
    py::error_already_set error;
    raise(absl::StatusCode::kInvalidArgument,
          what_ + ": " + object_type_ + ".__dlpack__() did not return a 'dltensor' capsule (" +
              error.what() + ")");
  }
  // The capsule stays unconsumed (not renamed): its destructor calls the exporter's deleter
  // when this object lets it go.
  keep_ = source;
  const DLTensor& t = managed->dl_tensor;
  for (int i = 0; i < t.ndim; ++i) shape_.push_back(t.shape[i]);
  itemsize_ = (uint64_t{t.dtype.bits} * t.dtype.lanes + 7) / 8;
  contiguous_ = row_major(shape_, t.strides, 1);
  data_ = static_cast<const std::byte*>(t.data) + t.byte_offset;
  dtype_ = t.dtype.lanes == 1 ? find_dtype(t.dtype.code, t.dtype.bits) : nullptr;
  type_name_ = type_name_of(t.dtype.code, t.dtype.bits, t.dtype.lanes);
}

std::string HostArray::description() const {
  const bool vowel = !type_name_.empty() && type_name_[0] == 'i';  // "an int32", "a uint8"
  std::string text = std::string(vowel ? "an " : "a ") + type_name_ + " " + object_type_;
  if (shape_.size() == 1) return text + " of " + std::to_string(count_) + " elements";
  return text + " of shape " + shape_text(shape_) + " (" + std::to_string(count_) + " elements)";
}

void HostArray::require_contiguous() const {
  if (contiguous_) return;
  raise(absl::StatusCode::kInvalidArgument,
        what_ + ": got " + description() +
            " whose elements are not contiguous in memory (a strided view); need a row-major "
            "(C-contiguous) array: pass numpy.ascontiguousarray(x) or tensor.contiguous()");
}

Float32Values::Float32Values(const py::handle& object, std::string what, uint64_t count,
                             const std::string& count_of)
    : array_(object, std::move(what)) {
  const DType* d = array_.dtype();
  const bool floating =
      d != nullptr && (d->name == "float32" || d->name == "float16" || d->name == "bfloat16");
  if (!floating || array_.count() != count) {
    std::string message = array_.what() + ": got " + array_.description() + "; need float32 with " +
                          std::to_string(count) + " elements (" + count_of + ")";
    if (!floating) {
      message +=
          ": convert it with .astype(numpy.float32) or tensor.float() (float16 and bfloat16 are "
          "widened exactly; other types are not converted here)";
    }
    raise(absl::StatusCode::kInvalidArgument, message);
  }
  array_.require_contiguous();
  const auto* bytes = static_cast<const std::byte*>(array_.data());
  if (d->name == "float32" && reinterpret_cast<uintptr_t>(bytes) % alignof(float) == 0) {
    span_ = std::span<const float>(reinterpret_cast<const float*>(bytes), count);
    return;
  }
  widened_.resize(count);
  if (d->name == "float32") {  // unaligned (a memoryview at an odd offset): copied
    std::memcpy(widened_.data(), bytes, count * sizeof(float));
  } else {
    const bool half = d->name == "float16";
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t bits = 0;
      std::memcpy(&bits, bytes + i * 2, sizeof bits);
      widened_[i] = half ? half_to_float(bits) : bf16_to_float(bits);
    }
  }
  span_ = widened_;
}

const char* buffer_format(const DType& dtype) {
  const std::string& n = dtype.name;
  if (n == "float32") return "f";
  if (n == "float64") return "d";
  if (n == "float16") return "e";
  if (n == "int8") return "b";
  if (n == "int16") return "h";
  if (n == "int32") return "i";
  if (n == "int64") return sizeof(long) == 8 ? "l" : "q";  // numpy's int64 on LP64 is 'l'
  if (n == "uint8") return "B";
  if (n == "bool") return "?";
  return nullptr;  // bfloat16: no buffer-protocol format
}

HostBuffer::HostBuffer(const DType& dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  if (buffer_format(dtype_) == nullptr) {
    raise(absl::StatusCode::kInvalidArgument,
          dtype_.name +
              " has no buffer-protocol format: it cannot be handed to Python as an "
              "array");
  }
  uint64_t count = 1;
  for (int64_t d : shape_) count *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
  nbytes_ = count * dtype_.itemsize;
  bytes_ = std::make_unique_for_overwrite<std::byte[]>(std::max<uint64_t>(nbytes_, 1));
}

py::object to_python(std::shared_ptr<HostBuffer> buffer) {
  py::object exported = py::cast(std::move(buffer));
  py::object numpy;
  try {
    numpy = py::module_::import("numpy");
  } catch (py::error_already_set& error) {
    if (!error.matches(PyExc_ImportError)) throw;
  }
  if (numpy) return numpy.attr("asarray")(exported);
  PyObject* view = PyMemoryView_FromObject(exported.ptr());
  if (view == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(view);
}

void bind_host_array(py::module_& m) {
  py::class_<HostBuffer, std::shared_ptr<HostBuffer>>(m, "HostBuffer", py::buffer_protocol(),
                                                      R"doc(
Host memory of strata's own with a dtype and a shape, exported through the buffer protocol:
what the module's array results are made of (handed out as numpy arrays when numpy imports,
else as memoryviews).)doc")
      .def_buffer([](HostBuffer& b) {
        const auto ndim = static_cast<py::ssize_t>(b.shape().size());
        std::vector<py::ssize_t> shape(b.shape().begin(), b.shape().end());
        std::vector<py::ssize_t> strides(shape.size());
        py::ssize_t stride = b.dtype().itemsize;
        for (size_t i = shape.size(); i-- > 0;) {
          strides[i] = stride;
          stride *= shape[i];
        }
        return py::buffer_info(b.data(), b.dtype().itemsize, buffer_format(b.dtype()), ndim,
                               std::move(shape), std::move(strides), /*readonly=*/false);
      });
}

}  // namespace strata::python
