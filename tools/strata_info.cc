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
#include "json.h"
#include "strata/base/cpu_topology.h"
#include "strata/base/size.h"
#include "strata/comm/nccl_library.h"
#include "strata/config/config.h"
#include "strata/config/machine_info.h"
#include "strata/device/backend.h"
#include "strata/device/cuda_libraries.h"
#include "strata/optimizer/cpu_pool.h"
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

// A string, or null where there is none.
Json json_optional(const std::optional<std::string>& value) {
  return value.has_value() ? Json(*value) : Json();
}

void print_json(const MachineInfo& m, const ResolvedConfig* c, const CpuPoolSettings& pool,
                const std::string& error, Json startup) {
  Json root{{"valid", c != nullptr}};
  if (!error.empty()) root["error"] = error;
  if (c != nullptr) {
    root["config"] = {{"backend", to_string(c->backend)},
                      {"backend_reason", c->backend_reason},
                      {"device", c->device},
                      {"device_reason", c->device_reason},
                      {"gpu_sharing", c->gpu_sharing},
                      {"gpu_sharing_reason", c->gpu_sharing_reason},
                      {"local_rank", c->local_rank ? Json(*c->local_rank) : Json()},
                      {"local_world_size", c->local_ranks},
                      {"gpu_bytes", c->gpu_bytes},
                      {"gpu_bytes_basis", c->gpu_bytes_basis},
                      {"cpu_bytes", c->cpu_bytes},
                      {"cpu_bytes_basis", c->cpu_bytes_basis},
                      {"nvme_paths", c->nvme_paths},
                      {"nvme_bytes", c->nvme_bytes},
                      {"io_engine", to_string(c->io_engine.kind)},
                      {"io_engine_reason", c->io_engine.reason},
                      {"io_depth", c->io_depth},
                      {"io_block", c->io_block},
                      {"staging_bytes", c->staging_bytes},
                      {"io_uring_registered_bytes", io_uring_registered_bytes(*c)},
                      {"verify", c->verify},
                      {"log", to_string(c->log)},
                      {"adam_threads", c->adam_pool.threads},
                      {"adam_reserve_cores", c->adam_pool.reserve_cores},
                      {"adam_pin", c->adam_pool.pin}};
    root["warnings"] = c->warnings;
  }
  Json paths = Json::array();
  for (const PathInfo& p : m.paths) {
    paths.push_back({{"path", p.path},
                     {"exists", p.exists},
                     {"is_directory", p.is_directory},
                     {"writable", p.writable},
                     {"problem", p.problem},
                     {"free_bytes", p.free_bytes},
                     {"total_bytes", p.total_bytes},
                     {"logical_block_size", p.logical_block_size},
                     {"block_size_known", p.block_size_known},
                     {"filesystem", p.filesystem}});
  }
  Json gpu = nullptr;
  if (m.gpu) {
    gpu = {{"ordinal", m.gpu->ordinal},
           {"name", m.gpu->name},
           {"total_bytes", m.gpu->total_bytes},
           {"free_bytes", m.gpu->free_bytes},
           {"compute_capability", absl::StrFormat("%d.%d", m.gpu->cc_major, m.gpu->cc_minor)}};
  }
  const CpuLines cpus = cpu_lines(pool);
  Json nodes = Json::array();
  for (const NumaNode& node : cpus.nodes) {
    nodes.push_back({{"id", node.id}, {"cpus", format_cpu_list(node.cpus)}});
  }
  root["machine"] = {{"backend", to_string(m.backend)},
                     {"backend_reason", m.backend_reason},
                     {"gpu_count", m.gpu_count},
                     {"cuda_visible_devices", json_optional(m.cuda_visible_devices)},
                     {"parent",
                      {{"pid", m.parent.pid},
                       {"readable", m.parent.readable},
                       {"problem", m.parent.problem},
                       {"cuda_visible_devices", json_optional(m.parent.cuda_visible_devices)},
                       {"strata_device", json_optional(m.parent.strata_device)}}},
                     {"gpu", std::move(gpu)},
                     {"physical_memory_bytes", m.physical_memory_bytes},
                     {"physical_memory_source", m.physical_memory_source},
                     {"available_memory_bytes", m.available_memory_bytes},
                     {"cpu_count", m.cpu_count},
                     {"cpu_model", m.cpu_model},
                     {"memlock_limit_bytes",
                      m.memlock_limit_bytes == kUnlimited ? Json() : Json(m.memlock_limit_bytes)},
                     {"has_cap_ipc_lock", m.has_cap_ipc_lock},
                     {"io_uring_available", m.io_uring.available},
                     {"io_uring_detail", m.io_uring.detail},
                     {"nvme_paths", std::move(paths)},
                     {"numa_nodes", std::move(nodes)},
                     {"numa_source", cpus.source}};
  if (cpus.pool.ok()) {
    root["adam_pool"] = {{"cpus", format_cpu_list(cpus.pool->cpus)},
                         {"threads", cpus.pool->cpus.size()},
                         {"node", cpus.pool->node},
                         {"pinned", cpus.pool->pinned},
                         {"reason", cpus.pool->reason}};
  } else {
    root["adam_pool"] = {{"error", std::string(cpus.pool.status().message())}};
  }
  const LibraryLines libraries = library_lines();
  root["libraries"] = {{"cuda_runtime", libraries.cuda_runtime},
                       {"cuda_driver", libraries.cuda_driver},
                       {"nccl_backend", libraries.nccl_backend},
                       {"nccl", libraries.nccl},
                       {"nccl_searched", libraries.nccl_searched}};
  if (!startup.is_null()) root["startup"] = std::move(startup);
  std::cout << json_line(root) << "\n";
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

Json startup_json(const StartupStats& s) {
  const PinningStats& p = s.pinning;
  return Json{{"create_seconds", json_fixed(s.create_seconds, 6)},
              {"piece_bytes", p.piece_bytes},
              {"pieces", p.pieces},
              {"pinned_pieces", p.pinned_pieces},
              {"pinned_bytes", p.pinned_bytes},
              {"pin_seconds", json_fixed(static_cast<double>(p.pin_ns) / 1e9, 6)},
              {"io_uring_rings", s.rings},
              {"registered_bytes", s.registered_bytes},
              {"registrations", s.registrations},
              {"registration_seconds", json_fixed(s.registration_seconds, 6)},
              {"registration_failures", s.registration_failures}};
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
               started && started->ok() ? startup_json(**started) : Json());
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
