// Errors: every failing absl::Status becomes a Python exception carrying the runtime's message.
// strata.Error (a RuntimeError) and subclasses that also derive from the matching built-in
// (InvalidArgumentError/ValueError, NotFoundError/KeyError, ResourceExhaustedError/MemoryError).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>

namespace strata::python {

// Thrown by the helpers below; the translator registered by bind_errors turns it into the
// matching strata exception.
struct StatusError {
  absl::StatusCode code;
  std::string message;
};

[[noreturn]] inline void raise(const absl::Status& status) {
  throw StatusError{status.code(), std::string(status.message())};
}
[[noreturn]] inline void raise(absl::StatusCode code, std::string message) {
  throw StatusError{code, std::move(message)};
}
inline void check(const absl::Status& status) {
  if (!status.ok()) raise(status);
}
template <typename T>
T check(absl::StatusOr<T> value) {
  if (!value.ok()) raise(value.status());
  return *std::move(value);
}

// Runs f() (returning absl::Status) without the GIL, then raises its error with the GIL held.
template <typename F>
void unlocked_check(F&& f) {
  absl::Status status;
  {
    pybind11::gil_scoped_release unlocked;
    status = f();
  }
  check(status);
}

// Defines strata.Error and its subclasses in `m` and registers the translator.
void bind_errors(pybind11::module_& m);

}  // namespace strata::python
