// resolve(): a Config checked against the machine, every size in bytes; load_configuration();
// render().
#include <absl/numeric/int128.h>
#include <absl/status/status.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config_internal.h"
#include "strata/base/text.h"
#include "strata/config/config.h"
#include "strata/config/nvme_settings.h"
#include "strata/device/backend.h"
#include "strata/nvme/io_engine.h"

namespace strata {

using namespace config_internal;  // NOLINT(build/namespaces): shared names of this module
using text::join;

namespace {

uint64_t saturating_product(uint64_t a, uint64_t b) {
  const absl::uint128 p = absl::uint128(a) * b;
  return p > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                  : static_cast<uint64_t>(p);
}

// Whether the device settings can be judged at all (validate_values reports them otherwise).
bool device_settings_valid(const Config& c) {
  const LocalRanks& l = c.local;
  return (!c.device || *c.device >= 0) && (!l.rank || *l.rank >= 0) &&
         (!l.world_size || *l.world_size >= 1) &&
         (!l.rank || !l.world_size || *l.rank < *l.world_size);
}

}  // namespace

// The whole tier once per ring: what is registered once the tier has filled (lazily, as it
// fills; see config.h).
uint64_t io_uring_registered_bytes(const ResolvedConfig& c) {
  if (c.io_engine.kind != IoEngineKind::kIoUring || c.nvme_paths.empty()) return 0;
  return saturating_product(c.cpu_bytes, c.nvme_paths.size());
}

uint64_t io_uring_registered_bytes_per_user(const ResolvedConfig& c) {
  return saturating_product(io_uring_registered_bytes(c), static_cast<uint64_t>(c.local_ranks));
}

absl::StatusOr<ResolvedConfig> resolve(const Config& config, const MachineInfo& machine) {
  // Caller errors first: without the machine's facts nothing else can be judged.
  for (const std::string& path : config.nvme_paths) {
    if (!path.empty() && machine.find_path(path) == nullptr) {
      return absl::FailedPreconditionError(
          cat("resolve() was given no facts for NVMe path '", path,
              "': probe it with probe_machine(config.nvme_paths), or call load_configuration()"));
    }
  }
  Errors errors;
  validate_values(config, errors);
  if (machine.backend == Backend::kAuto) {
    return absl::FailedPreconditionError(
        "resolve() needs MachineInfo::backend set to cuda or host: fill it from "
        "choose_backend(), or call load_configuration()");
  }
  const bool cuda = machine.backend == Backend::kCuda;
  if (cuda && machine.gpu_count < 1) {
    return absl::FailedPreconditionError(
        "resolve() needs MachineInfo::gpu_count on the cuda backend: fill it from "
        "choose_backend(), or call load_configuration()");
  }

  ResolvedConfig r;
  r.backend = machine.backend;
  r.backend_reason = machine.backend_reason;
  if (config.backend != Backend::kAuto && config.backend != machine.backend) {
    errors.add(absl::FailedPreconditionError(
        cat(kBackend, "=", to_string(config.backend), " but the device layer chose ",
            to_string(machine.backend), " (", machine.backend_reason,
            "): set STRATA_BACKEND=auto or make the requested backend available")));
  }
  r.local_rank = config.local.rank;
  r.local_ranks = std::max(1, config.local.count());
  r.local_source = config.local.source;
  r.io_depth = config.io_depth;
  r.io_block = config.io_block;
  r.staging_bytes = config.staging_bytes;
  r.verify = config.verify;
  r.log = config.log;
  r.comm = config.comm;
  r.adam_pool = config.adam_pool;
  // The pool's CPUs are chosen later (next to the states), but whether the settings can be met
  // at all depends only on how many CPUs this process may run on.
  const CpuPoolSettings& pool = config.adam_pool;
  if (machine.cpu_count > 0 && pool.reserve_cores >= machine.cpu_count) {
    errors.add(
        invalid(cat(kAdamReserveCores, "=", pool.reserve_cores,
                    " reserves every CPU this process may run on (", machine.cpu_count,
                    "), leaving none to the Adam pool: use at most ", machine.cpu_count - 1)));
  } else if (machine.cpu_count > 0 && pool.threads > machine.cpu_count - pool.reserve_cores) {
    errors.add(invalid(cat(kAdamThreads, "=", pool.threads, " is more than the ",
                           machine.cpu_count - pool.reserve_cores, " CPUs this process may run on",
                           pool.reserve_cores > 0
                               ? cat(" less ", kAdamReserveCores, "=", pool.reserve_cores)
                               : std::string(),
                           ": use at most that many, or 0 for the states' NUMA node")));
  }
  r.nvme_paths = config.nvme_paths;

  // The device: on cuda its facts must be the chosen device's before its memory is judged.
  bool device_known = false;
  if (device_settings_valid(config)) {
    absl::StatusOr<DeviceChoice> device = choose_device(config, machine);
    if (!device.ok()) {
      errors.add(device.status());
    } else {
      r.device = device->ordinal;
      r.device_reason = device->reason;
      r.gpu_sharing = device->sharing;
      r.gpu_sharing_reason = device->sharing_reason;
      if (cuda && !machine.gpu) {
        return absl::FailedPreconditionError(
            cat("resolve() needs MachineInfo::gpu on the cuda backend: fill it from gpu_info(",
                r.device, "), or call load_configuration()"));
      }
      if (cuda && machine.gpu->ordinal != r.device) {
        return absl::FailedPreconditionError(cat(
            "resolve() was given the facts of GPU ", machine.gpu->ordinal, " but device ", r.device,
            " is chosen (", r.device_reason, "): fill MachineInfo::gpu from gpu_info(", r.device,
            "), or call load_configuration()"));
      }
      device_known = true;
    }
  }
  if (config.local.rank && !config.local.world_size) {
    r.warnings.push_back(
        cat(kLocalRank, "=", *config.local.rank, " is set but ", kLocalWorldSize,
            " is not: memory percentages are of the whole node, as if this rank had it to itself; "
            "set ",
            kLocalWorldSize,
            " to the number of ranks on this node (torchrun and "
            "strata-run set both)"));
  }

  // Memory is divided among the local ranks: percentages are of this rank's share.
  const int ranks = r.local_ranks;
  const uint64_t physical = machine.physical_memory_bytes;
  const std::string physical_text = cat(format_bytes(physical), " of physical memory (from ",
                                        machine.physical_memory_source, ")");
  const uint64_t ram_share = physical / static_cast<uint64_t>(ranks);
  const std::string ram_share_text =
      ranks == 1 ? cat("the ", physical_text)
                 : cat("this rank's share of RAM (", format_bytes(physical), " / ", kLocalWorldSize,
                       "=", ranks, " = ", format_bytes(ram_share), ")");
  const auto basis = [](const SizeSetting& setting, const std::string& of) {
    return setting.is_percent ? cat(setting.to_string(), " of ", of) : std::string();
  };

  // GPU arena: on cuda out of the chosen device's total memory divided among the local ranks
  // that share it, at most its free memory; on host it is ordinary host memory, out of this
  // rank's share of RAM.
  const SizeSetting gpu_setting = config.gpu_bytes.value_or(
      cuda ? SizeSetting::of_percent(80) : SizeSetting::of_bytes(uint64_t{1} << 30));
  if (device_known) {
    uint64_t gpu_total = ram_share;
    std::string gpu_share_text = ram_share_text;
    std::string gpu_name;
    if (cuda) {
      const GpuInfo& g = *machine.gpu;
      const uint64_t sharing = static_cast<uint64_t>(r.gpu_sharing);
      gpu_name =
          absl::StrFormat("GPU %d (%s, %s total)", g.ordinal, g.name, format_bytes(g.total_bytes));
      gpu_total = std::min(g.free_bytes, g.total_bytes / sharing);
      gpu_share_text =
          sharing == 1
              ? cat("the ", format_bytes(g.free_bytes), " free on GPU ", g.ordinal)
              : cat("this rank's share of GPU ", g.ordinal, " (", format_bytes(g.total_bytes),
                    " / ", sharing, " ranks sharing it = ", format_bytes(g.total_bytes / sharing),
                    ", at most the ", format_bytes(g.free_bytes), " free; ", r.gpu_sharing_reason,
                    ")");
    }
    if (absl::StatusOr<uint64_t> gpu = gpu_setting.resolve(gpu_total, kGpuBytes); !gpu.ok()) {
      errors.add(gpu.status());
    } else if (const uint64_t has = cuda ? machine.gpu->free_bytes : physical; *gpu > has) {
      const std::string what =
          cuda ? cat("the ", format_bytes(has), " free on ", gpu_name)
               : cat("the ", physical_text, " that backs the host backend's arena");
      errors.add(absl::ResourceExhaustedError(cat(kGpuBytes, "=", gpu_setting.to_string(), " (",
                                                  format_bytes(*gpu), ") is more than ", what,
                                                  ": lower it or use a percentage such as 80%")));
    } else if (cuda && r.gpu_sharing > 1 &&
               absl::uint128(*gpu) * static_cast<uint64_t>(r.gpu_sharing) >
                   machine.gpu->total_bytes) {
      errors.add(absl::ResourceExhaustedError(
          cat(kGpuBytes, "=", gpu_setting.to_string(), " (", format_bytes(*gpu), ") × ",
              r.gpu_sharing, " ranks sharing the device = ",
              format_bytes(saturating_product(*gpu, static_cast<uint64_t>(r.gpu_sharing))),
              " is more than the ", format_bytes(machine.gpu->total_bytes), " of GPU ",
              machine.gpu->ordinal, " (", machine.gpu->name, "; ", r.gpu_sharing_reason,
              "): lower it, or use a percentage such as 80%, which is of this rank's share")));
    } else {
      r.gpu_bytes = *gpu;
      r.gpu_bytes_basis = basis(gpu_setting, gpu_share_text);
      r.gpu_budget_sharing = cuda && gpu_setting.is_percent ? r.gpu_sharing : 0;
    }
  }

  if (absl::StatusOr<uint64_t> cpu = config.cpu_bytes.resolve(ram_share, kCpuBytes); !cpu.ok()) {
    errors.add(cpu.status());
  } else if (*cpu > physical) {
    errors.add(absl::ResourceExhaustedError(
        cat(kCpuBytes, "=", config.cpu_bytes.to_string(), " (", format_bytes(*cpu),
            ") is more than the ", physical_text, ": lower it or use a percentage such as 25%")));
  } else {
    r.cpu_bytes = *cpu;
    r.cpu_bytes_basis = basis(config.cpu_bytes, ram_share_text);
  }

  // Every local rank pins its own CPU tier (and, on host, its arena) out of the same physical
  // memory. Staging is carved from the CPU tier (runtime.cc), so it adds nothing. Absolute sizes
  // count as if every local rank asked the same: the ranks of a launch share one environment.
  if (r.cpu_bytes > 0 && (r.gpu_bytes > 0 || cuda) && errors.empty()) {
    const uint64_t host_arena = cuda ? 0 : r.gpu_bytes;
    const absl::uint128 per_rank = absl::uint128(r.cpu_bytes) + host_arena;
    const absl::uint128 wanted = per_rank * static_cast<uint64_t>(ranks);
    if (wanted > physical) {
      const std::string parts = cat(kCpuBytes, " (", format_bytes(r.cpu_bytes), ")",
                                    cuda ? ""
                                         : cat(" + ", kGpuBytes, " (", format_bytes(host_arena),
                                               ", host memory on the host backend)"));
      if (ranks == 1) {
        errors.add(absl::ResourceExhaustedError(
            cat(parts, " exceed the ", physical_text, ": lower one of them")));
      } else {
        const uint64_t total = wanted > std::numeric_limits<uint64_t>::max()
                                   ? std::numeric_limits<uint64_t>::max()
                                   : static_cast<uint64_t>(wanted);
        errors.add(absl::ResourceExhaustedError(
            cat(parts, " per rank × ", kLocalWorldSize, "=", ranks,
                " ranks on this node = ", format_bytes(total), " exceed the ", physical_text,
                ": every local rank pins its own; lower them, or use percentages, which are of ",
                ram_share_text)));
      }
    }
  }

  // NVMe paths: each must be a writable directory with room for the swap files.
  std::optional<uint64_t> nvme_bytes;
  for (const std::string& path : config.nvme_paths) {
    if (path.empty()) continue;  // reported by validate_values
    const PathInfo* info = machine.find_path(path);
    const std::string entry = cat(kNvmePaths, " entry '", path, "'");
    if (!info->exists && (info->problem.empty() || info->problem == "does not exist")) {
      errors.add(absl::NotFoundError(cat(entry, " does not exist: create it (mkdir -p ", path,
                                         ") or remove it from ", kNvmePaths)));
      continue;
    }
    if (!info->exists) {
      errors.add(absl::PermissionDeniedError(
          cat(entry, " ", info->problem,
              ": check the permissions of its parent directories or choose another one")));
      continue;
    }
    if (!info->is_directory) {
      errors.add(absl::FailedPreconditionError(
          cat(entry,
              " is not a directory: give directories in which strata may create its swap "
              "files")));
      continue;
    }
    if (!info->writable) {
      errors.add(absl::PermissionDeniedError(
          cat(entry, " ", info->problem.empty() ? "is not writable" : info->problem,
              ": fix its permissions or mount, or choose another directory")));
      continue;
    }
    absl::StatusOr<uint64_t> bytes = config.nvme_bytes.resolve(info->free_bytes, kNvmeBytes);
    if (!bytes.ok()) {
      errors.add(bytes.status());
    } else if (*bytes > info->free_bytes) {
      errors.add(absl::ResourceExhaustedError(
          cat(kNvmeBytes, "=", config.nvme_bytes.to_string(), " (", format_bytes(*bytes),
              " per path) is more than the free space on '", path,
              "': ", format_bytes(info->free_bytes), " free of ", format_bytes(info->total_bytes),
              "; lower it, use a percentage such as 50%, or free space")));
    } else {
      nvme_bytes = std::min(nvme_bytes.value_or(*bytes), *bytes);
    }
    if (config.io_block % info->logical_block_size != 0) {
      errors.add(invalid(cat(kIoBlock, "=", size_text(config.io_block),
                             " is not a multiple of the logical block size (",
                             info->logical_block_size, " bytes) of the device under '", path,
                             "', which O_DIRECT needs: use a multiple of it")));
    }
  }
  if (nvme_bytes && config.io_block > 0) {
    // Whole I/O blocks only; equal on every path so that stripes line up.
    r.nvme_bytes = *nvme_bytes / config.io_block * config.io_block;
    if (r.nvme_bytes == 0) {
      errors.add(invalid(cat(kNvmeBytes, "=", config.nvme_bytes.to_string(), " (",
                             format_bytes(*nvme_bytes), ") is less than one ", kIoBlock, " (",
                             format_bytes(config.io_block), "): raise it")));
    }
  }

  // I/O engine: decided once, by the NVMe floor's decide_io_engine(), from what the machine
  // offers (its one io_uring probe); the swap space starts what was decided here (and decides
  // again only if io_uring then fails on the swap files under auto).
  absl::StatusOr<IoEngineDecision> engine =
      decide_io_engine(config.io_engine, machine.io_uring, io_setting_names());
  if (!engine.ok()) {
    errors.add(engine.status());
  } else {
    r.io_engine = *std::move(engine);
    if (config.nvme_paths.empty()) {
      r.io_engine.warning.clear();  // without an NVMe tier the fallback costs nothing
    } else if (!r.io_engine.warning.empty()) {
      r.warnings.push_back(r.io_engine.warning);
    }
  }
  // RLIMIT_MEMLOCK bounds what io_uring can register; the kernel charges it to the user, so
  // the local ranks of a node (one user) add up. Registration is lazy (piece by piece as the
  // tier fills), so this compares the most that will be registered, once the tiers have filled:
  // the limit may be reached late in training, not at start. Registration failing only costs
  // CPU.
  if (const uint64_t registered = io_uring_registered_bytes(r);
      registered > 0 && !memlock_allows(machine, io_uring_registered_bytes_per_user(r))) {
    const size_t paths = r.nvme_paths.size();
    std::string sum = cat(kCpuBytes, " (", format_bytes(r.cpu_bytes), ")");
    if (paths > 1) sum += cat(" × ", paths, " NVMe paths");
    if (ranks > 1) sum += cat(" × ", kLocalWorldSize, "=", ranks, " ranks");
    r.warnings.push_back(cat(
        "the pinned CPU tier is registered with io_uring once per NVMe path",
        ranks > 1 ? ", and the kernel charges every local rank's registration to the one user" : "",
        ": ", sum,
        (paths > 1 || ranks > 1) ? cat(" = ", format_bytes(io_uring_registered_bytes_per_user(r)))
                                 : std::string(),
        " is above RLIMIT_MEMLOCK (", format_bytes(machine.memlock_limit_bytes),
        ") and the process lacks CAP_IPC_LOCK: the tier will not all be registered (NVMe reads "
        "cost about 4x more CPU per GB); raise the limit (ulimit -l unlimited, docker run "
        "--ulimit memlock=-1, LimitMEMLOCK=infinity in systemd)"));
  }

  if (!errors.empty()) return errors.status();
  return r;
}

absl::StatusOr<MachineInfo> probe_machine_for(const Config& config) {
  absl::StatusOr<MachineInfo> machine = probe_machine(config.nvme_paths);
  if (!machine.ok()) return machine.status();
  absl::StatusOr<BackendChoice> choice = choose_backend(config.backend);
  if (!choice.ok()) return choice.status();
  machine->backend = choice->backend;
  machine->backend_reason = std::move(choice->reason);
  machine->gpu_count = choice->device_count;
  if (machine->backend == Backend::kCuda && device_settings_valid(config)) {
    // Out of range is left to resolve(), which names the variables.
    if (absl::StatusOr<DeviceChoice> device = choose_device(config, *machine); device.ok()) {
      absl::StatusOr<GpuInfo> gpu = gpu_info(device->ordinal);
      if (!gpu.ok()) return gpu.status();
      machine->gpu = *std::move(gpu);
    }
  }
  return machine;
}

absl::StatusOr<std::pair<ResolvedConfig, MachineInfo>> load_configuration(const Config& config) {
  absl::StatusOr<MachineInfo> machine = probe_machine_for(config);
  if (!machine.ok()) return machine.status();
  absl::StatusOr<ResolvedConfig> resolved = resolve(config, *machine);
  if (!resolved.ok()) return resolved.status();
  return std::make_pair(*std::move(resolved), *std::move(machine));
}

std::string render(const ResolvedConfig& c) {
  const auto bytes = [](uint64_t b) { return cat(format_bytes(b), " (", b, " bytes)"); };
  const auto with_basis = [&bytes](uint64_t b, const std::string& basis) {
    return basis.empty() ? bytes(b) : cat(bytes(b), ": ", basis);
  };
  const std::vector<std::pair<std::string_view, std::string>> rows = {
      {kBackend, cat(to_string(c.backend), " (", c.backend_reason, ")")},
      {kDevice,
       cat(c.device, ": ", c.device_reason, c.backend == Backend::kCuda ? "" : "; unused on host",
           c.backend == Backend::kCuda && c.gpu_sharing > 1
               ? cat("; shared by ", c.gpu_sharing, " local ranks (", c.gpu_sharing_reason, ")")
               : "")},
      {kGpuBytes, with_basis(c.gpu_bytes, c.gpu_bytes_basis)},
      {kCpuBytes, with_basis(c.cpu_bytes, c.cpu_bytes_basis)},
      {kNvmePaths,
       c.nvme_paths.empty() ? std::string("(none: no NVMe tier)") : join(c.nvme_paths, ",")},
      {kNvmeBytes, c.nvme_paths.empty() ? std::string("0 (no NVMe tier)")
                                        : cat(bytes(c.nvme_bytes), " per path")},
      {kIoEngine, cat(to_string(c.io_engine.kind), " (", c.io_engine.reason, ")")},
      {kIoDepth, cat(c.io_depth)},
      {kIoBlock, bytes(c.io_block)},
      {kStagingBytes, bytes(c.staging_bytes)},
      {kVerify, c.verify ? "on" : "off"},
      {kLog, std::string(to_string(c.log))},
      {kCommBackend, std::string(to_string(c.comm.backend))},
      {kCommTimeout, format_duration(c.comm.timeout)},
      {kCommDebug, c.comm.debug ? "on" : "off"},
      {kAdamThreads, c.adam_pool.threads == 0
                         ? std::string("0 (every CPU of the states' NUMA node)")
                         : cat(c.adam_pool.threads)},
      {kAdamReserveCores, cat(c.adam_pool.reserve_cores)},
      {kAdamPin, c.adam_pool.pin ? "on" : "off"},
      {kLocalRank, c.local_rank
                       ? cat(*c.local_rank, c.local_source.empty()
                                                ? std::string()
                                                : cat(" (SLURM_LOCALID: ", c.local_source, ")"))
                       : std::string("unset")},
      {kLocalWorldSize,
       c.local_ranks > 1
           ? cat(c.local_ranks, " (ranks on this node: memory is divided among them",
                 c.local_source.empty() ? "" : "; srun's tasks per node", ")")
           : std::string("1 (unset or 1: this rank has the node's memory to itself)")},
  };
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [name, value] : rows) {
    out += cat(name, std::string(width - name.size(), ' '), " = ", value, "\n");
  }
  return out;
}

}  // namespace strata
