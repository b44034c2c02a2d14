#include "names.h"

#include <pybind11/stl.h>

#include <cctype>
#include <map>

#include "errors.h"
#include "strata/base/size.h"

namespace py = pybind11;

namespace strata::python {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

TierKind parse_tier(const std::string& text, bool allow_nvme) {
  const std::string t = lower(text);
  if (t == "gpu" || t == "cuda" || t == "device") return TierKind::kGpu;
  if (t == "cpu" || t == "host") return TierKind::kCpu;
  if (allow_nvme && t == "nvme") return TierKind::kNvme;
  raise(absl::StatusCode::kInvalidArgument,
        "'" + text + "' is not a tier: use " + (allow_nvme ? "gpu, cpu or nvme" : "gpu or cpu"));
}

std::string tier_name(TierKind kind) { return std::string(to_string(kind)); }

AccessMode parse_mode(const std::string& text) {
  const std::string t = lower(text);
  if (t == "r" || t == "read") return AccessMode::kRead;
  if (t == "w" || t == "write" || t == "rw" || t == "r+" || t == "readwrite") {
    return AccessMode::kWrite;
  }
  // Every byte written before any is read: nothing is fetched first.
  if (t == "o" || t == "overwrite") return AccessMode::kOverwrite;
  raise(absl::StatusCode::kInvalidArgument,
        "'" + text +
            "' is not an access mode: use 'r' (read), 'w' (write) or 'o' (overwrite: every byte "
            "written before any is read, nothing fetched)");
}

const std::vector<DType>& dtypes() {
  static const std::vector<DType> table = {
      {"float32", {kDLFloat, 32, 1}, 4}, {"float64", {kDLFloat, 64, 1}, 8},
      {"float16", {kDLFloat, 16, 1}, 2}, {"bfloat16", {kDLBfloat, 16, 1}, 2},
      {"int8", {kDLInt, 8, 1}, 1},       {"int16", {kDLInt, 16, 1}, 2},
      {"int32", {kDLInt, 32, 1}, 4},     {"int64", {kDLInt, 64, 1}, 8},
      {"uint8", {kDLUInt, 8, 1}, 1},     {"bool", {kDLBool, 8, 1}, 1},
  };
  return table;
}

const DType& uint8_dtype() { return dtypes()[8]; }

const DType& dtype_named(const std::string& name) {
  for (const DType& d : dtypes()) {
    if (d.name == name) return d;
  }
  raise(absl::StatusCode::kInternal, "strata has no dtype named " + name);
}

DType parse_dtype(const py::handle& object) {
  std::string text;
  if (py::isinstance<py::str>(object)) {
    text = object.cast<std::string>();
  } else if (py::hasattr(object, "is_floating_point")) {  // torch.dtype: "torch.float32"
    text = py::str(object).cast<std::string>();
  } else {
    // numpy dtypes and scalar types, through numpy's Python API (numpy.dtype(x).name reads the
    // same in numpy 1.x and 2.x), and only when numpy is loaded: without it there are none.
    text = py::str(object).cast<std::string>();
    const py::object numpy = py::module_::import("sys").attr("modules").attr("get")("numpy");
    if (!numpy.is_none()) {
      try {
        text = numpy.attr("dtype")(object).attr("name").cast<std::string>();
      } catch (const py::error_already_set&) {
      }
    }
  }
  std::string t = lower(text);
  if (t.starts_with("torch.")) t = t.substr(6);
  static const std::map<std::string, std::string> aliases = {
      {"float", "float32"}, {"half", "float16"}, {"double", "float64"}, {"int", "int32"},
      {"long", "int64"},    {"short", "int16"},  {"f4", "float32"},     {"f2", "float16"},
      {"f8", "float64"},    {"bf16", "bfloat16"}};
  if (auto it = aliases.find(t); it != aliases.end()) t = it->second;
  for (const DType& d : dtypes()) {
    if (d.name == t) return d;
  }
  raise(absl::StatusCode::kInvalidArgument,
        "'" + text +
            "' is not a dtype strata knows: use float32, float64, float16, bfloat16, int8, int16, "
            "int32, int64, uint8 or bool");
}

// A byte count: an int or a size string ("32MiB"); 0 only where `allow_zero`.
uint64_t size_arg(const py::object& value, const char* what, bool allow_zero) {
  if (py::isinstance<py::str>(value)) {
    absl::StatusOr<uint64_t> bytes = parse_size(value.cast<std::string>());
    if (!bytes.ok())
      raise(absl::StatusCode::kInvalidArgument,
            std::string(what) + "=" + std::string(bytes.status().message()));
    return *bytes;
  }
  const auto n = value.cast<int64_t>();
  if (n < 0 || (n == 0 && !allow_zero)) {
    raise(absl::StatusCode::kInvalidArgument,
          std::string(what) + "=" + std::to_string(n) + ": a " +
              (allow_zero ? "byte count >= 0" : "positive byte count") + " (or '32MiB')");
  }
  return static_cast<uint64_t>(n);
}

}  // namespace strata::python
