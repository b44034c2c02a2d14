#include "dlpack_export.h"

#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "acquisition.h"

namespace py = pybind11;

namespace strata::python {
namespace {

struct DlpackContext {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  py::object owner;
};

void dlpack_deleter(DLManagedTensor* self) {
  auto* context = static_cast<DlpackContext*>(self->manager_ctx);
  py::gil_scoped_acquire gil;
  delete context;
}

void dlpack_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "used_dltensor") != 0) return;  // a consumer owns it now
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) {
    PyErr_WriteUnraisable(capsule);
  } else if (managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
}

}  // namespace

py::capsule to_dlpack(const py::object& self) {
  auto& acquisition = self.cast<Acquisition&>();
  acquisition.check_live();
  const PyTensor& t = *acquisition.tensor;
  auto context = std::make_unique<DlpackContext>();
  context->shape = t.shape;
  context->strides.assign(t.shape.size(), 1);
  for (size_t i = t.shape.size(); i-- > 1;) {
    context->strides[i - 1] = context->strides[i] * t.shape[i];
  }
  context->owner = self;
  DLTensor& dl = context->managed.dl_tensor;
  dl.data = acquisition.data;
  dl.device = acquisition.dl_device();
  dl.ndim = static_cast<int32_t>(t.shape.size());
  dl.dtype = t.dtype.dl;
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  dl.byte_offset = 0;
  context->managed.manager_ctx = context.get();
  context->managed.deleter = dlpack_deleter;
  PyObject* capsule = PyCapsule_New(&context->managed, "dltensor", dlpack_capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  context.release();  // owned by the capsule (or its consumer) now
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace strata::python
