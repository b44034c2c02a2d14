// strata-info: the resolved configuration and what this machine offers; with --start, also what
// creating a runtime from it costs (time to create, pinning and io_uring registration so far).
//
// Exit codes: 0 configuration valid; 1 configuration invalid (the message names the variable);
// 2 bad command line.
#include <absl/status/statusor.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "strata/base/cpu_topology.h"
#include "strata/base/size.h"
#include "strata/base/text.h"
#include "strata/comm/nccl_library.h"
#include "strata/config/config.h"
#include "strata/config/machine_info.h"
#include "strata/device/backend.h"
#include "strata/device/cuda_libraries.h"
#include "strata/offload/cpu_pool.h"
#include "strata/runtime/runtime.h"

namespace strata {
namespace {

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

// `registered`: what the configuration registers with io_uring across this node's ranks
// (io_uring_registered_bytes_per_user); nullopt when the configuration is invalid.
std::string memlock_text(const MachineInfo& m, std::optional<uint64_t> registered) {
  const std::string what = registered
                               ? absl::StrFormat(
                                     "the %s that this configuration registers with io_uring "
                                     "(the CPU tier once per NVMe path, for every local rank)",
                                     format_bytes(*registered))
                               : std::string("buffers");
  if (m.has_cap_ipc_lock) {
    return absl::StrFormat("not enforced (the process has CAP_IPC_LOCK): %s can be registered",
                           what);
  }
  if (m.memlock_limit_bytes == kUnlimited) {
    return absl::StrFormat("unlimited: %s can be registered", what);
  }
  const std::string limit = format_bytes(m.memlock_limit_bytes);
  if (!registered) return limit;
  if (*registered == 0) {
    return absl::StrFormat("%s (nothing is registered with io_uring: no NVMe tier or psync)",
                           limit);
  }
  if (memlock_allows(m, *registered)) {
    return absl::StrFormat("%s: enough to register %s", limit, what);
  }
  return absl::StrFormat(
      "%s: too small to register %s, so NVMe I/O runs without registered buffers (more CPU per "
      "GB); raise it with ulimit -l unlimited, docker run --ulimit memlock=-1 or "
      "LimitMEMLOCK=infinity",
      limit, what);
}

std::string gpu_text(const MachineInfo& m) {
  if (!m.gpu) {
    if (m.gpu_count > 0) return absl::StrFormat("%d visible (none selected)", m.gpu_count);
    return absl::StrFormat("none (%s)", m.backend_reason);
  }
  const GpuInfo& g = *m.gpu;
  return absl::StrFormat("%s (device %d of %d visible, compute capability %d.%d): %s free of %s",
                         g.name, g.ordinal, m.gpu_count, g.cc_major, g.cc_minor,
                         format_bytes(g.free_bytes), format_bytes(g.total_bytes));
}

std::string path_text(const PathInfo& p) {
  if (!p.problem.empty()) return p.problem;
  return absl::StrFormat("%s, %s free of %s, logical block %u bytes%s", p.filesystem,
                         format_bytes(p.free_bytes), format_bytes(p.total_bytes),
                         p.logical_block_size, p.block_size_known ? "" : " (assumed)");
}

// The run-time libraries: what was found where (the CUDA runtime is linked in; the driver and
// NCCL are found at run time).
struct LibraryLines {
  std::string cuda_runtime;
  std::string cuda_driver;
  std::string nccl_backend;  // built or not, and why (the build's cmake/StrataNccl.cmake)
  std::string nccl;
  std::vector<std::string> nccl_searched;
};

LibraryLines library_lines() {
  LibraryLines out;
  const CudaLibraries cuda = cuda_libraries();
  out.cuda_runtime = cuda.runtime_built ? absl::StrFormat("CUDA %s, linked statically",
                                                          cuda_version_text(cuda.runtime_version))
                                        : std::string("none: this build has no CUDA backend");
  out.cuda_driver = cuda.driver_found
                        ? absl::StrFormat("libcuda.so.1 at %s, supports CUDA %s",
                                          cuda.driver_path.empty() ? "?" : cuda.driver_path,
                                          cuda_version_text(cuda.driver_version))
                        : absl::StrFormat("not found: no GPU driver (%s)", cuda.driver_error);
  out.nccl_backend = std::string(nccl_backend_note());
  if (!nccl_backend_built()) {
    out.nccl = "not searched: this build has no NCCL backend (above)";
    return out;
  }
  const NcclSearch& nccl = nccl_library();
  out.nccl = nccl.found() ? absl::StrFormat("NCCL %s at %s (from %s)",
                                            nccl_version_text(nccl.version), nccl.path, nccl.step)
                          : absl::StrFormat("not found: %s", nccl.error.message());
  out.nccl_searched = nccl.tried;
  return out;
}

// The NUMA nodes this process may run on and where the Adam pool would go (docs/optimizer.md,
// "Thread placement"). With no optimizer states yet, the node holding them is unknown: an
// optimizer's pool moves to its states' node at its first step.
struct CpuLines {
  std::vector<NumaNode> nodes;  // allowed CPUs only
  std::string source;
  std::string nodes_text;
  absl::StatusOr<CpuPlacement> pool = absl::UnknownError("not probed");
};

CpuLines cpu_lines(const CpuPoolSettings& settings) {
  CpuLines out;
  absl::StatusOr<std::vector<int>> allowed = allowed_cpus();
  absl::StatusOr<CpuTopology> topology = allowed.ok()
                                             ? read_cpu_topology_or_one_node(*allowed)
                                             : absl::StatusOr<CpuTopology>(allowed.status());
  if (!topology.ok()) {
    out.nodes_text = absl::StrFormat("unknown: %s", topology.status().message());
  } else {
    out.source = topology->source;
    std::vector<std::string> parts;
    for (const NumaNode& node : topology->nodes) {
      NumaNode mine{node.id, {}};
      for (int cpu : node.cpus) {
        if (std::binary_search(allowed->begin(), allowed->end(), cpu)) mine.cpus.push_back(cpu);
      }
      parts.push_back(absl::StrFormat("node %d: CPUs %s", node.id, format_cpu_list(mine.cpus)));
      out.nodes.push_back(std::move(mine));
    }
    out.nodes_text = absl::StrFormat("%d (%s; allowed CPUs shown): %s", topology->nodes.size(),
                                     topology->source, absl::StrJoin(parts, "; "));
  }
  out.pool = cpu_placement_here(settings, nullptr);
  return out;
}

std::string pool_text(const absl::StatusOr<CpuPlacement>& pool) {
  if (!pool.ok()) return absl::StrFormat("invalid: %s", pool.status().message());
  return pool->reason;
}

void print_text(const MachineInfo& m, const ResolvedConfig* config, const CpuPoolSettings& pool) {
  std::ostringstream out;
  if (config != nullptr) {
    out << "Configuration (STRATA_* variables; defaults where unset)\n";
    std::istringstream lines(render(*config));
    for (std::string line; std::getline(lines, line);) out << "  " << line << "\n";
    if (!config->warnings.empty()) {
      out << "\nWarnings\n";
      for (const std::string& w : config->warnings) out << "  - " << w << "\n";
    }
    out << "\n";
  }
  const auto row = [&out](std::string_view name, const std::string& value) {
    out << absl::StrFormat("  %-20s %s\n", std::string(name), value);
  };
  out << "Machine\n";
  row("backend", absl::StrFormat("%s (%s)", std::string(to_string(m.backend)), m.backend_reason));
  row("GPU", gpu_text(m));
  if (config != nullptr) {
    const std::string& why = config->device_reason;
    row("device",
        absl::StrFormat("device %d%s%s%s", config->device, why.starts_with("from ") ? " " : ": ",
                        why, m.backend == Backend::kCuda ? "" : " (unused on host)"));
  }
  row("CUDA_VISIBLE_DEVICES", m.cuda_visible_devices.value_or("unset"));
  // What the device choice compares with: the same value there is inherited from the launch.
  const ParentEnvironment& parent = m.parent;
  row("launched by",
      parent.readable
          ? absl::StrFormat(
                "process %d, which has CUDA_VISIBLE_DEVICES%s and STRATA_DEVICE%s", parent.pid,
                parent.cuda_visible_devices ? "=" + *parent.cuda_visible_devices
                                            : std::string(" unset"),
                parent.strata_device ? "=" + *parent.strata_device : std::string(" unset"))
          : absl::StrFormat("process %d, whose environment cannot be read (%s)", parent.pid,
                            parent.problem));
  row("CPU", absl::StrFormat("%s, %u CPUs available", m.cpu_model, m.cpu_count));
  const CpuLines cpus = cpu_lines(pool);
  row("NUMA nodes", cpus.nodes_text);
  row("Adam pool", pool_text(cpus.pool));
  row("memory",
      absl::StrFormat("%s physical (from %s), %s available", format_bytes(m.physical_memory_bytes),
                      m.physical_memory_source, format_bytes(m.available_memory_bytes)));
  row("memlock limit",
      memlock_text(m, config != nullptr
                          ? std::optional<uint64_t>(io_uring_registered_bytes_per_user(*config))
                          : std::nullopt));
  row("io_uring", m.io_uring.available
                      ? absl::StrFormat("available (%s)", m.io_uring.detail)
                      : absl::StrFormat("unavailable: %s; NVMe I/O uses psync", m.io_uring.detail));
  if (m.paths.empty()) row("NVMe paths", "none (STRATA_NVME_PATHS is empty: no NVMe tier)");
  for (const PathInfo& p : m.paths) row(p.path, path_text(p));
  const LibraryLines libraries = library_lines();
  out << "\nLibraries\n";
  row("CUDA runtime", libraries.cuda_runtime);
  row("CUDA driver", libraries.cuda_driver);
  row("NCCL backend", libraries.nccl_backend);
  row("NCCL", libraries.nccl);
  for (const std::string& step : libraries.nccl_searched) row("", "searched: " + step);
  std::cout << out.str();
}

// A JSON object built field by field.
class JsonObject {
 public:
  JsonObject& raw(std::string_view key, const std::string& value) {
    text_ += absl::StrFormat("%s%s: %s", text_.empty() ? "" : ", ", text::json_quote(key), value);
    return *this;
  }
  JsonObject& str(std::string_view key, std::string_view value) {
    return raw(key, text::json_quote(value));
  }
  JsonObject& num(std::string_view key, uint64_t value) { return raw(key, std::to_string(value)); }
  JsonObject& flag(std::string_view key, bool value) { return raw(key, value ? "true" : "false"); }
  std::string done() const { return "{" + text_ + "}"; }

 private:
  std::string text_;
};

std::string json_list(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return "[" + out + "]";
}

void print_json(const MachineInfo& m, const ResolvedConfig* c, const CpuPoolSettings& pool,
                const std::string& error, const std::string& startup) {
  JsonObject root;
  root.flag("valid", c != nullptr);
  if (!error.empty()) root.str("error", error);
  if (c != nullptr) {
    std::vector<std::string> paths;
    for (const std::string& p : c->nvme_paths) paths.push_back(text::json_quote(p));
    std::vector<std::string> warnings;
    for (const std::string& w : c->warnings) warnings.push_back(text::json_quote(w));
    root.raw("config", JsonObject()
                           .str("backend", to_string(c->backend))
                           .str("backend_reason", c->backend_reason)
                           .num("device", static_cast<uint64_t>(c->device))
                           .str("device_reason", c->device_reason)
                           .num("gpu_sharing", static_cast<uint64_t>(c->gpu_sharing))
                           .str("gpu_sharing_reason", c->gpu_sharing_reason)
                           .raw("local_rank", c->local_rank ? std::to_string(*c->local_rank)
                                                            : std::string("null"))
                           .num("local_world_size", static_cast<uint64_t>(c->local_ranks))
                           .num("gpu_bytes", c->gpu_bytes)
                           .str("gpu_bytes_basis", c->gpu_bytes_basis)
                           .num("cpu_bytes", c->cpu_bytes)
                           .str("cpu_bytes_basis", c->cpu_bytes_basis)
                           .raw("nvme_paths", json_list(paths))
                           .num("nvme_bytes", c->nvme_bytes)
                           .str("io_engine", to_string(c->io_engine.kind))
                           .str("io_engine_reason", c->io_engine.reason)
                           .num("io_depth", c->io_depth)
                           .num("io_block", c->io_block)
                           .num("staging_bytes", c->staging_bytes)
                           .num("io_uring_registered_bytes", io_uring_registered_bytes(*c))
                           .flag("verify", c->verify)
                           .str("log", to_string(c->log))
                           .num("adam_threads", c->adam_pool.threads)
                           .num("adam_reserve_cores", c->adam_pool.reserve_cores)
                           .flag("adam_pin", c->adam_pool.pin)
                           .done());
    root.raw("warnings", json_list(warnings));
  }
  std::vector<std::string> paths;
  for (const PathInfo& p : m.paths) {
    paths.push_back(JsonObject()
                        .str("path", p.path)
                        .flag("exists", p.exists)
                        .flag("is_directory", p.is_directory)
                        .flag("writable", p.writable)
                        .str("problem", p.problem)
                        .num("free_bytes", p.free_bytes)
                        .num("total_bytes", p.total_bytes)
                        .num("logical_block_size", p.logical_block_size)
                        .flag("block_size_known", p.block_size_known)
                        .str("filesystem", p.filesystem)
                        .done());
  }
  JsonObject machine;
  machine.str("backend", to_string(m.backend))
      .str("backend_reason", m.backend_reason)
      .num("gpu_count", static_cast<uint64_t>(m.gpu_count))
      .raw("cuda_visible_devices",
           m.cuda_visible_devices ? text::json_quote(*m.cuda_visible_devices) : std::string("null"))
      .raw("parent",
           JsonObject()
               .num("pid", static_cast<uint64_t>(m.parent.pid))
               .flag("readable", m.parent.readable)
               .str("problem", m.parent.problem)
               .raw("cuda_visible_devices", m.parent.cuda_visible_devices
                                                ? text::json_quote(*m.parent.cuda_visible_devices)
                                                : std::string("null"))
               .raw("strata_device", m.parent.strata_device
                                         ? text::json_quote(*m.parent.strata_device)
                                         : std::string("null"))
               .done());
  if (m.gpu) {
    machine.raw("gpu", JsonObject()
                           .num("ordinal", static_cast<uint64_t>(m.gpu->ordinal))
                           .str("name", m.gpu->name)
                           .num("total_bytes", m.gpu->total_bytes)
                           .num("free_bytes", m.gpu->free_bytes)
                           .str("compute_capability",
                                absl::StrFormat("%d.%d", m.gpu->cc_major, m.gpu->cc_minor))
                           .done());
  } else {
    machine.raw("gpu", "null");
  }
  machine.num("physical_memory_bytes", m.physical_memory_bytes)
      .str("physical_memory_source", m.physical_memory_source)
      .num("available_memory_bytes", m.available_memory_bytes)
      .num("cpu_count", m.cpu_count)
      .str("cpu_model", m.cpu_model)
      .raw("memlock_limit_bytes", m.memlock_limit_bytes == kUnlimited
                                      ? std::string("null")
                                      : std::to_string(m.memlock_limit_bytes))
      .flag("has_cap_ipc_lock", m.has_cap_ipc_lock)
      .flag("io_uring_available", m.io_uring.available)
      .str("io_uring_detail", m.io_uring.detail)
      .raw("nvme_paths", json_list(paths));
  const CpuLines cpus = cpu_lines(pool);
  std::vector<std::string> nodes;
  for (const NumaNode& node : cpus.nodes) {
    nodes.push_back(JsonObject()
                        .num("id", static_cast<uint64_t>(node.id))
                        .str("cpus", format_cpu_list(node.cpus))
                        .done());
  }
  machine.raw("numa_nodes", json_list(nodes)).str("numa_source", cpus.source);
  root.raw("machine", machine.done());
  if (cpus.pool.ok()) {
    root.raw("adam_pool", JsonObject()
                              .str("cpus", format_cpu_list(cpus.pool->cpus))
                              .num("threads", cpus.pool->cpus.size())
                              .num("node", static_cast<uint64_t>(cpus.pool->node))
                              .flag("pinned", cpus.pool->pinned)
                              .str("reason", cpus.pool->reason)
                              .done());
  } else {
    root.raw("adam_pool",
             JsonObject().str("error", std::string(cpus.pool.status().message())).done());
  }
  const LibraryLines libraries = library_lines();
  std::vector<std::string> searched;
  for (const std::string& step : libraries.nccl_searched)
    searched.push_back(text::json_quote(step));
  root.raw("libraries", JsonObject()
                            .str("cuda_runtime", libraries.cuda_runtime)
                            .str("cuda_driver", libraries.cuda_driver)
                            .str("nccl_backend", libraries.nccl_backend)
                            .str("nccl", libraries.nccl)
                            .raw("nccl_searched", json_list(searched))
                            .done());
  if (!startup.empty()) root.raw("startup", startup);
  std::cout << root.done() << "\n";
}

// --start: a runtime from this configuration, as a trainer creates it, and what that cost. The
// CPU tier's pieces are registered with io_uring in the background: wait for that first, so the
// figures include it.
absl::StatusOr<StartupStats> start_runtime(const Config& config) {
  auto runtime = Runtime::create(config);
  if (!runtime.ok()) return runtime.status();
  (*runtime)->cpu().wait_piece_listener();
  return (*runtime)->startup();
}

std::string startup_json(const StartupStats& s) {
  const PinningStats& p = s.pinning;
  return JsonObject()
      .raw("create_seconds", absl::StrFormat("%.6f", s.create_seconds))
      .num("piece_bytes", p.piece_bytes)
      .num("pieces", p.pieces)
      .num("pinned_pieces", p.pinned_pieces)
      .num("pinned_bytes", p.pinned_bytes)
      .raw("pin_seconds", absl::StrFormat("%.6f", static_cast<double>(p.pin_ns) / 1e9))
      .num("io_uring_rings", s.rings)
      .num("registered_bytes", s.registered_bytes)
      .num("registrations", s.registrations)
      .raw("registration_seconds", absl::StrFormat("%.6f", s.registration_seconds))
      .num("registration_failures", s.registration_failures)
      .done();
}

int run(int argc, char** argv) {
  bool json = false;
  bool start = false;
  cli::FlagSet flags("strata-info",
                     "Prints the configuration strata resolves from the STRATA_* environment "
                     "variables and what this machine offers (GPU, memory, memlock limit, "
                     "io_uring, NVMe paths). Exits 1 when the configuration is invalid.");
  flags.add_bool("json", &json, "print one JSON object instead of text");
  flags.add_bool("start", &start,
                 "also create a runtime from this configuration (allocating its tiers) and report "
                 "what that cost: the time to create it, and how much of the pinned CPU tier is "
                 "pinned and registered with io_uring (piece by piece as it fills)");
  std::vector<std::string> positional;
  if (std::optional<int> exit_code = flags.parse_or_exit(argc, argv, &positional)) {
    return *exit_code;
  }
  if (!positional.empty()) {
    return flags.usage_error(
        absl::StrFormat("unexpected argument '%s': strata-info takes none", positional.front()));
  }

  // The same steps as load_configuration(), kept apart so that the machine's facts are still
  // printed when the configuration does not fit them (a device out of range included).
  const auto fail = [](const absl::Status& status) {
    return cli::print_error("strata-info", std::string(status.message()));
  };
  absl::StatusOr<Config> config = Config::from_environment();
  if (!config.ok()) return fail(config.status());
  absl::StatusOr<MachineInfo> machine = probe_machine_for(*config);
  if (!machine.ok()) return fail(machine.status());

  absl::StatusOr<ResolvedConfig> resolved = resolve(*config, *machine);
  const ResolvedConfig* shown = resolved.ok() ? &*resolved : nullptr;
  std::optional<absl::StatusOr<StartupStats>> started;
  if (start && resolved.ok()) started = start_runtime(*config);
  const absl::Status start_status = started ? started->status() : absl::OkStatus();
  if (json) {
    std::string error(resolved.ok() ? start_status.message() : resolved.status().message());
    print_json(*machine, shown, config->adam_pool, error,
               started && started->ok() ? startup_json(**started) : std::string());
  } else {
    print_text(*machine, shown, config->adam_pool);
    if (started && started->ok()) {
      std::cout << "\nStart-up (--start: a runtime created from this configuration)\n";
      std::istringstream lines(to_string(**started));
      for (std::string line; std::getline(lines, line);) std::cout << "  " << line << "\n";
    }
  }
  if (!resolved.ok()) return fail(resolved.status());
  if (!start_status.ok()) return fail(start_status);
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::run(argc, argv); }
