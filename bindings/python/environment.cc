#include "environment.h"

#include <pybind11/stl.h>

#include <cctype>

#include "strata/comm/launch.h"
#include "strata/config/slurm.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// The launch variables a Communicator reads (strata/comm/launch.h: torch's, torchrun's and
// srun's).
bool is_launch_variable_name(const std::string& name) { return is_launch_variable(name); }

// The launch variables the configuration reads (the device, the memory shares): Config's, with
// the ones that tell whether srun's stand in for them.
bool is_config_launch_variable(const std::string& name) {
  return name == "LOCAL_RANK" || name == "LOCAL_WORLD_SIZE" || name == "RANK" ||
         name == "WORLD_SIZE" || is_slurm_task_variable(name);
}

// os.environ rather than getenv: what Python code (and pytest's monkeypatch) sees. With
// `launch`, the launch variables too; always those the configuration reads.
std::map<std::string, std::string> strata_environment(bool launch = false) {
  std::map<std::string, std::string> vars;
  py::dict environ = py::module_::import("os").attr("environ").attr("copy")();
  for (auto [key, value] : environ) {
    const auto name = key.cast<std::string>();
    if (name.starts_with("STRATA_") || is_config_launch_variable(name) ||
        (launch && is_launch_variable_name(name))) {
      vars[name] = value.cast<std::string>();
    }
  }
  return vars;
}

// A keyword's value as the variable's text: True/False as on/off, lists of paths joined by ','.
std::string override_text(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "on" : "off";
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    std::string joined;
    for (const py::handle item : value) {
      if (!joined.empty()) joined += ",";
      joined += py::str(py::module_::import("os").attr("fspath")(item)).cast<std::string>();
    }
    return joined;
  }
  if (py::hasattr(value, "__fspath__")) {
    return py::str(py::module_::import("os").attr("fspath")(value)).cast<std::string>();
  }
  return py::str(value).cast<std::string>();
}

}  // namespace

std::map<std::string, std::string> runtime_variables(const py::kwargs& overrides) {
  std::map<std::string, std::string> vars = strata_environment();
  for (auto [key, value] : overrides) {
    std::string name = key.cast<std::string>();
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!name.starts_with("STRATA_")) name = "STRATA_" + name;
    if (value.is_none()) {
      vars.erase(name);  // back to the default
    } else {
      vars[name] = override_text(value);
    }
  }
  return vars;
}

CommVariables communicator_variables(const py::kwargs& overrides) {
  std::map<std::string, std::string> vars = strata_environment(/*launch=*/true);
  for (auto [key, value] : overrides) {
    std::string name = key.cast<std::string>();
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!is_launch_variable_name(name) && !name.starts_with("STRATA_")) name = "STRATA_" + name;
    if (value.is_none()) {
      vars.erase(name);
    } else {
      vars[name] = override_text(value);
    }
  }
  CommVariables split;
  for (auto& [name, value] : vars) {
    (is_launch_variable_name(name) ? split.launch : split.strata)[name] = std::move(value);
  }
  return split;
}

}  // namespace strata::python
