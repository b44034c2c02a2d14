#include "errors.h"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace strata::python {
namespace {

struct Exceptions {
  PyObject* error = nullptr;                // strata.Error(RuntimeError)
  PyObject* invalid_argument = nullptr;     // (Error, ValueError)
  PyObject* not_found = nullptr;            // (Error, KeyError)
  PyObject* already_exists = nullptr;       // (Error, ValueError)
  PyObject* resource_exhausted = nullptr;   // (Error, MemoryError)
  PyObject* failed_precondition = nullptr;  // (Error)
};
Exceptions g_exceptions;

PyObject* exception_for(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return g_exceptions.invalid_argument;
    case absl::StatusCode::kNotFound:
      return g_exceptions.not_found;
    case absl::StatusCode::kAlreadyExists:
      return g_exceptions.already_exists;
    case absl::StatusCode::kResourceExhausted:
      return g_exceptions.resource_exhausted;
    case absl::StatusCode::kFailedPrecondition:
      return g_exceptions.failed_precondition;
    default:
      return g_exceptions.error;
  }
}

PyObject* new_exception(py::module_& m, const char* name, PyObject* error_base, PyObject* builtin) {
  const std::string qualified = std::string("strata.") + name;
  py::object bases = builtin == nullptr
                         ? py::reinterpret_borrow<py::object>(error_base)
                         : py::object(py::make_tuple(py::handle(error_base), py::handle(builtin)));
  PyObject* type = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // steals a reference; the type lives with the module
  Py_INCREF(type);
  return type;
}

}  // namespace

void bind_errors(py::module_& m) {
  g_exceptions.error = new_exception(m, "Error", PyExc_RuntimeError, nullptr);
  g_exceptions.invalid_argument =
      new_exception(m, "InvalidArgumentError", g_exceptions.error, PyExc_ValueError);
  g_exceptions.not_found = new_exception(m, "NotFoundError", g_exceptions.error, PyExc_KeyError);
  g_exceptions.already_exists =
      new_exception(m, "AlreadyExistsError", g_exceptions.error, PyExc_ValueError);
  g_exceptions.resource_exhausted =
      new_exception(m, "ResourceExhaustedError", g_exceptions.error, PyExc_MemoryError);
  g_exceptions.failed_precondition =
      new_exception(m, "FailedPreconditionError", g_exceptions.error, nullptr);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(exception_for(e.code), e.message.c_str());
    }
  });
}

}  // namespace strata::python
