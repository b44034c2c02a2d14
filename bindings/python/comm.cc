#include "comm.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "environment.h"
#include "errors.h"
#include "host_array.h"
#include "launcher_store.h"
#include "strata/base/text.h"
#include "strata/config/config.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// Joins the job `launch` describes, through `launcher` where one is given (the rendezvous waits
// for the other ranks without the GIL; the launcher's store takes it for its calls).
std::shared_ptr<PyCommunicator> join(const std::shared_ptr<PyRuntime>& rt, const LaunchInfo& launch,
                                     const Config& config, LauncherStore* launcher) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm;
  {
    py::gil_scoped_release unlocked;
    comm = Communicator::create(CommOptions{.launch = launch,
                                            .settings = config.comm,
                                            .device = rt ? &rt->device() : nullptr,
                                            .launcher_store = launcher});
  }
  return std::make_shared<PyCommunicator>(rt, check(std::move(comm)));
}

std::shared_ptr<PyRuntime> runtime_of(const py::object& runtime) {
  if (runtime.is_none()) return nullptr;
  return runtime.cast<std::shared_ptr<PyRuntime>>();
}

// A launcher's store failed to open (strata/_launch.py raised): the message is the user's.
[[noreturn]] void raise_python_error(py::error_already_set& e, absl::StatusCode code) {
  std::string message = py::str(e.value());
  raise(code, std::move(message));
}

// The job of torch.distributed's default process group (`group`: strata/_launch.py's
// torch_process_group()), its store the meeting point. RANK and WORLD_SIZE, where set, must be
// torch's.
std::shared_ptr<PyCommunicator> join_torch(const std::shared_ptr<PyRuntime>& rt,
                                           const py::tuple& group, CommVariables vars) {
  const py::object store = group[0];
  const int rank = group[1].cast<int>();
  const int world = group[2].cast<int>();
  const std::string backend = group[3].cast<std::string>();
  const std::string host = group[4].cast<std::string>();
  for (const auto& [name, value] : {std::pair<std::string, int>{"RANK", rank},
                                    std::pair<std::string, int>{"WORLD_SIZE", world}}) {
    const auto it = vars.launch.find(name);
    if (it != vars.launch.end() && text::trim(it->second) != std::to_string(value)) {
      raise(absl::StatusCode::kFailedPrecondition,
            name + "=" + it->second + " but torch.distributed says this process is rank " +
                std::to_string(rank) + " of " + std::to_string(world) +
                ": strata joins torch's job, so the two must agree (unset " + name +
                ", or initialise torch.distributed with the launcher's rank and world size)");
    }
  }
  vars.launch["RANK"] = std::to_string(rank);
  vars.launch["WORLD_SIZE"] = std::to_string(world);
  if (!vars.launch.count("MASTER_ADDR")) vars.launch["MASTER_ADDR"] = host;
  // torch's store, not torchrun's agent store nor MASTER_PORT, is the meeting point.
  vars.launch.erase("TORCHELASTIC_USE_AGENT_STORE");
  absl::StatusOr<LaunchInfo> launch = LaunchInfo::from_variables(vars.launch);
  absl::StatusOr<Config> config = Config::from_variables(vars.strata);
  if (!launch.ok()) raise(launch.status());
  if (!config.ok()) raise(config.status());
  PyLauncherStore launcher(store, "torch.distributed's store (process group of " +
                                      std::to_string(world) + " rank(s), backend " + backend + ")");
  return join(rt, *launch, *config, &launcher);
}

py::object torch_process_group() {
  return py::module_::import("strata._launch").attr("torch_process_group")();
}

std::shared_ptr<PyCommunicator> from_torch(const py::object& runtime, const py::kwargs& overrides) {
  for (auto [key, value] : overrides) {
    std::string name = key.cast<std::string>();
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (is_launch_variable(upper)) {
      raise(absl::StatusCode::kInvalidArgument,
            "Communicator.from_torch(" + name +
                "=...): the job is torch.distributed's (its rank, world size and store); only "
                "STRATA_COMM_* settings are accepted here (comm_timeout=, comm_backend=, ...)");
    }
  }
  const py::object group = torch_process_group();
  if (group.is_none()) {
    raise(absl::StatusCode::kFailedPrecondition,
          "Communicator.from_torch(): torch.distributed is not initialised in this process: call "
          "torch.distributed.init_process_group(...) first, or use "
          "Communicator.from_environment()");
  }
  return join_torch(runtime_of(runtime), group.cast<py::tuple>(),
                    communicator_variables(overrides));
}

std::shared_ptr<PyCommunicator> from_environment(const py::object& runtime,
                                                 const py::kwargs& overrides) {
  std::shared_ptr<PyRuntime> rt = runtime_of(runtime);
  CommVariables vars = communicator_variables(overrides);
  bool launch_given = false;
  for (auto [key, value] : overrides) {
    std::string name = key.cast<std::string>();
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    launch_given = launch_given || is_launch_variable(name);
  }
  if (launch_given) {
    // Keywords describe a job of their own, not the one the launcher started: its agent's
    // store is not that job's meeting point (unless the keywords say so).
    for (const char* name :
         {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"}) {
      if (!overrides.contains(text::lower(name))) vars.launch.erase(name);
    }
  } else if (py::object group = torch_process_group(); !group.is_none()) {
    // The script initialised torch.distributed: the same job, through torch's store.
    return join_torch(rt, group.cast<py::tuple>(), std::move(vars));
  }
  absl::StatusOr<LaunchInfo> launch = LaunchInfo::from_variables(vars.launch);
  absl::StatusOr<Config> config = Config::from_variables(vars.strata);
  if (!launch.ok() && !config.ok()) {
    raise(absl::StatusCode::kInvalidArgument,
          std::string(launch.status().message()) + "\n" + std::string(config.status().message()));
  }
  if (!launch.ok()) raise(launch.status());
  if (!config.ok()) raise(config.status());
  if (!launch->agent_store || launch->world_size == 1) return join(rt, *launch, *config, nullptr);
  // torchrun: its agent serves MASTER_ADDR:MASTER_PORT; strata joins through that store.
  py::object store;
  try {
    store = py::module_::import("strata._launch")
                .attr("agent_store")(launch->master_addr, launch->master_port,
                                     config->comm.timeout.count());
  } catch (py::error_already_set& e) {
    raise_python_error(e, absl::StatusCode::kUnavailable);
  }
  PyLauncherStore launcher(std::move(store), "torchrun's agent store at " + launch->master_addr +
                                                 ":" + std::to_string(launch->master_port));
  return join(rt, *launch, *config, &launcher);
}

ReduceOp parse_op(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "average" || op == "avg" || op == "mean") return ReduceOp::kAverage;
  if (op == "max") return ReduceOp::kMax;
  if (op == "min") return ReduceOp::kMin;
  raise(absl::StatusCode::kInvalidArgument,
        "'" + op + "' is not a reduction: use sum, average, max or min");
}

// An array's element type as the communicator's.
DataType data_type(const HostArray& a) {
  const std::string name = a.dtype() != nullptr ? a.dtype()->name : "";
  if (name == "float32") return DataType::kFloat32;
  if (name == "float64") return DataType::kFloat64;
  if (name == "float16") return DataType::kFloat16;
  if (name == "int32") return DataType::kInt32;
  if (name == "int64") return DataType::kInt64;
  if (name == "uint8") return DataType::kUInt8;
  raise(absl::StatusCode::kInvalidArgument,
        a.what() + ": got " + a.description() + "; " + a.type_name() +
            " is not one the communicator reduces: use float16, float32, float64, int32, int64 "
            "or uint8");
}

// A copy of the argument's elements (the input stays as it was), of its dtype and shape: the
// buffer the collective works in and the call returns.
std::shared_ptr<HostBuffer> copy_of(const HostArray& data) {
  data.require_contiguous();
  auto result = std::make_shared<HostBuffer>(*data.dtype(), data.shape());
  if (data.nbytes() > 0) std::memcpy(result->data(), data.data(), data.nbytes());
  return result;
}

// A collective's outcome once it has finished on the host.
absl::Status finished(absl::StatusOr<std::unique_ptr<CollectiveWork>> work) {
  if (!work.ok()) return work.status();
  return (*work)->synchronize();
}

// Host arrays on a communicator that takes device buffers only (NCCL): the copy travels through
// device memory of the communicator's runtime, piece by piece (each piece copied in, reduced or
// broadcast there, copied back, on one stream). A piece is at most kBouncePieceBytes, so a
// start-up broadcast of a whole model takes that much device memory beside the runtime's arena,
// not the model's size; every rank cuts the same pieces (the same shape and dtype on every
// rank), so each piece is one collective on all of them. A buffer up to kBounceKeptBytes is kept
// for the next call (a step's loss reduction then costs no allocation); a larger one is freed.
constexpr uint64_t kBouncePieceBytes = uint64_t{16} << 20;
constexpr uint64_t kBounceKeptBytes = uint64_t{1} << 20;

template <typename Collective>
absl::Status bounced(PyCommunicator& c, void* host, uint64_t count, DataType type,
                     Collective& collective) {
  const uint64_t size = element_size(type);
  const uint64_t piece_count = std::max<uint64_t>(1, kBouncePieceBytes / size);
  const uint64_t bytes = std::max<uint64_t>(size, std::min(count, piece_count) * size);
  Device& device = c.rt->device();
  MutexLock lock(&c.bounce_mutex);
  if (c.bounce_memory == nullptr || c.bounce_memory->size() < bytes) {
    c.bounce_memory.reset();
    absl::StatusOr<std::unique_ptr<DeviceMemory>> memory = device.allocate_device_memory(bytes);
    if (!memory.ok()) return memory.status();
    c.bounce_memory = *std::move(memory);
  }
  if (c.bounce_stream == nullptr) {
    absl::StatusOr<std::unique_ptr<Stream>> stream = device.create_stream();
    if (!stream.ok()) return stream.status();
    c.bounce_stream = *std::move(stream);
  }
  void* on_device = c.bounce_memory->data();
  Stream& stream = *c.bounce_stream;
  auto* at = static_cast<std::byte*>(host);
  absl::Status status;
  uint64_t done = 0;
  do {  // an empty array is one empty collective, as on the host path
    const uint64_t n = std::min(count - done, piece_count);
    status = device.copy_async(on_device, at, n * size, CopyKind::kHostToDevice, stream);
    if (status.ok()) status = finished(collective(on_device, n, type, {.stream = &stream}));
    if (status.ok()) {
      status = device.copy_async(at, on_device, n * size, CopyKind::kDeviceToHost, stream);
    }
    if (status.ok()) status = device.synchronize(stream);
    at += n * size;
    done += n;
  } while (status.ok() && done < count);
  if (c.bounce_memory->size() > kBounceKeptBytes) c.bounce_memory.reset();
  return status;
}

// Runs `collective(buffer, count, type, options)` in place on a copy of `data`, without the GIL,
// waits for it, and returns the copy: a new array of the input's shape and dtype. Where the
// communicator takes device buffers only, through device memory (bounced() above).
template <typename Collective>
py::object on_copy(PyCommunicator& c, const HostArray& data, const std::string& op,
                   Collective collective) {
  const DataType type = data_type(data);
  std::shared_ptr<HostBuffer> result = copy_of(data);
  void* buffer = result->data();
  const uint64_t count = data.count();
  if (!c.comm->needs_device_buffers()) {
    unlocked_check([&] { return finished(collective(buffer, count, type, {})); });
  } else if (c.rt == nullptr) {
    raise(absl::StatusCode::kFailedPrecondition,
          op + ": this communicator is " + std::string(to_string(c.comm->backend())) +
              ", which moves device memory only, and has no Runtime whose device memory the " +
              "host array could go through: create it with Communicator.from_environment(runtime)");
  } else {
    unlocked_check([&] { return bounced(c, buffer, count, type, collective); });
  }
  return to_python(std::move(result));
}

py::object all_reduce(PyCommunicator& c, const py::handle& input, const std::string& op_text) {
  const ReduceOp op = parse_op(op_text);
  return on_copy(
      c, HostArray(input, "all_reduce: array"), "all_reduce",
      [&](void* buffer, uint64_t count, DataType type, const CollectiveOptions& options) {
        return c.comm->all_reduce(buffer, buffer, count, type, op, options);
      });
}

// root's `array` on every rank: a new array of the same shape and dtype.
py::object broadcast(PyCommunicator& c, const py::handle& input, int root) {
  if (root < 0 || root >= c.comm->size()) {
    raise(absl::StatusCode::kInvalidArgument, "broadcast: root " + std::to_string(root) +
                                                  " is not a rank of this job (0.." +
                                                  std::to_string(c.comm->size() - 1) + ")");
  }
  return on_copy(
      c, HostArray(input, "broadcast: array"), "broadcast",
      [&](void* buffer, uint64_t count, DataType type, const CollectiveOptions& options) {
        return c.comm->broadcast(buffer, count, type, root, options);
      });
}

py::dict comm_stats(const CommStats& s) {
  py::dict d;
  for (size_t i = 0; i < s.by_kind.size(); ++i) {
    const CommStats::PerKind& k = s.by_kind[i];
    py::dict kind;
    kind["calls"] = k.calls;
    kind["bytes"] = k.bytes;
    kind["wire_bytes"] = k.wire_bytes;
    d[py::str(std::string(to_string(static_cast<CollectiveKind>(i))))] = kind;
  }
  d["total_bytes"] = s.total_bytes();
  d["total_wire_bytes"] = s.total_wire_bytes();
  return d;
}

}  // namespace

void bind_comm(py::module_& m) {
  py::class_<PyCommunicator, std::shared_ptr<PyCommunicator>>(m, "Communicator", R"doc(
The ranks of a data-parallel job and the collectives between them: Gloo for host buffers, NCCL
for a CUDA runtime's. Create it with Communicator.from_environment().)doc")
      .def_static("from_environment", &from_environment, py::arg("runtime") = py::none(),
                  R"doc(
Joins the job this process was launched into. Every rank calls it; it returns once all have.
- torchrun (TORCHELASTIC_USE_AGENT_STORE=True): through the store torchrun's agent serves on
  MASTER_ADDR:MASTER_PORT (torch's TCPStore client); strata never binds that port.
- a script that already called torch.distributed.init_process_group: that job, through torch's
  store, with torch's rank and world size (as from_torch()).
- srun without torch's variables: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID stand in for RANK,
  WORLD_SIZE, LOCAL_RANK (MASTER_ADDR and MASTER_PORT must be exported).
- otherwise RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (strata-run sets them; none
  set: a job of one rank), rank 0 serving the rendezvous on MASTER_PORT.
With the STRATA_COMM_* settings. `runtime`: the Runtime whose device the collectives use (a
ZeroEngine needs its own runtime's). Keywords override the environment: rank=, world_size=,
local_rank=, master_addr=, master_port= (any of these: a job of their own, torch.distributed and
torchrun's store not consulted) set the launch variables, others STRATA_<NAME>
(comm_timeout="30s", comm_backend="gloo", comm_debug=True); None unsets.)doc")
      .def_static("from_torch", &from_torch, py::arg("runtime") = py::none(),
                  R"doc(
Joins the job of torch.distributed's default process group, which this process has initialised
(init_process_group): torch's rank and world size (RANK and WORLD_SIZE, where set, must agree),
its store as the meeting point (no second port, no second set of variables). Keywords:
STRATA_COMM_* settings only (comm_timeout=, comm_backend=, comm_debug=).)doc")
      .def_property_readonly("rank", [](PyCommunicator& c) { return c.comm->rank(); })
      .def_property_readonly("size", [](PyCommunicator& c) { return c.comm->size(); })
      .def_property_readonly(
          "backend", [](PyCommunicator& c) { return std::string(to_string(c.comm->backend())); })
      .def_property_readonly("runtime", [](PyCommunicator& c) { return c.rt; })
      .def(
          "stats", [](PyCommunicator& c) { return comm_stats(c.comm->stats()); },
          "Per collective kind {calls, bytes, wire_bytes}, and total_bytes, total_wire_bytes.")
      .def("all_reduce", &all_reduce, py::arg("array"), py::arg("op") = "sum",
           "A new numpy array (a memoryview without numpy): `array` (host memory: numpy, "
           "torch CPU, any buffer; row-major) reduced over the ranks (sum, average, max, min). "
           "Any backend: on NCCL the array goes through the runtime's device memory. Every rank "
           "calls it with the same shape and dtype.")
      .def("broadcast", &broadcast, py::arg("array"), py::arg("root") = 0,
           "A new numpy array (a memoryview without numpy): rank `root`'s `array` on every "
           "rank. Any backend: on NCCL the array goes through the runtime's device memory. Every "
           "rank calls it with the same shape and dtype.")
      .def(
          "barrier",
          [](PyCommunicator& c) { unlocked_check([&] { return finished(c.comm->barrier()); }); },
          "Returns once every rank has called it.")
      .def("__repr__",
           [](PyCommunicator& c) { return "strata.Communicator(" + c.comm->description() + ")"; });
}

}  // namespace strata::python
