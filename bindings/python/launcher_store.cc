#include "launcher_store.h"

#include <absl/status/status.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <vector>

namespace py = pybind11;

namespace strata::python {
namespace {

// torch reports a timed-out wait as RuntimeError/DistStoreError "Socket Timeout" (1.x) or
// "wait timeout after ..." (2.x): both say so in their words.
bool is_timeout(const std::string& what) {
  return what.find("imeout") != std::string::npos || what.find("timed out") != std::string::npos;
}

}  // namespace

absl::Status PyLauncherStore::set(const std::string& key, const std::string& value) {
  py::gil_scoped_acquire gil;
  try {
    store_.attr("set")(key, py::bytes(value));
  } catch (py::error_already_set& e) {
    return absl::UnavailableError(e.what());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PyLauncherStore::get(const std::string& key,
                                                 std::chrono::milliseconds timeout) {
  py::gil_scoped_acquire gil;
  try {
    // torch's Store.get waits with the store's own timeout: wait() with ours first.
    store_.attr("wait")(std::vector<std::string>{key}, timeout);
  } catch (py::error_already_set& e) {
    const std::string what = e.what();
    if (is_timeout(what)) return absl::DeadlineExceededError(what);
    return absl::UnavailableError(what);
  }
  try {
    return store_.attr("get")(key).cast<std::string>();
  } catch (py::error_already_set& e) {
    return absl::UnavailableError(e.what());
  } catch (py::cast_error&) {
    return absl::InvalidArgumentError("the store's get() returned no bytes");
  }
}

}  // namespace strata::python
