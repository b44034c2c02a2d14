// choose_device(): which GPU this rank uses (STRATA_DEVICE, else LOCAL_RANK, else 0) and how
// many local ranks are taken to share it, for the budgets of resolve().
#include <absl/status/status.h>
#include <absl/strings/numbers.h>

#include <optional>
#include <string>

#include "config_internal.h"
#include "strata/config/config.h"

namespace strata {

using namespace config_internal;  // NOLINT(build/namespaces): shared names of this module

namespace {

std::string visible_text(const MachineInfo& m) {
  return m.cuda_visible_devices ? cat("CUDA_VISIBLE_DEVICES=", *m.cuda_visible_devices)
                                : std::string("CUDA_VISIBLE_DEVICES unset");
}

std::string devices_text(int count) {
  return cat(count, " CUDA device", count == 1 ? " is" : "s are", " visible");
}

// Whether a variable this rank has came unchanged from the launch (the same on every local
// rank) or was set for this rank: compared with the parent process's environment.
enum class Origin { kInherited, kPerRank, kUnknown };

Origin origin_of(bool same_as_parent, const ParentEnvironment& parent) {
  if (!parent.readable) return Origin::kUnknown;
  return same_as_parent ? Origin::kInherited : Origin::kPerRank;
}

std::string parent_text(const ParentEnvironment& parent) {
  return cat("process ", parent.pid, ", which started this one");
}

std::string parent_value(std::string_view name, const std::optional<std::string>& value) {
  return value ? cat(name, "=", *value) : cat(name, " unset");
}

// STRATA_DEVICE as the parent has it, parsed as Config does (nullopt: unset or not a number).
std::optional<int> parent_device(const ParentEnvironment& parent) {
  int ordinal = 0;
  if (!parent.strata_device ||
      !absl::SimpleAtoi(to_absl(text::trim(*parent.strata_device)), &ordinal) || ordinal < 0) {
    return std::nullopt;
  }
  return ordinal;
}

}  // namespace

absl::StatusOr<DeviceChoice> choose_device(const Config& config, const MachineInfo& machine) {
  const bool cuda = machine.backend == Backend::kCuda;
  const LocalRanks& local = config.local;
  const int ranks = local.count();
  const int count = machine.gpu_count;
  const ParentEnvironment& parent = machine.parent;
  // A CUDA_VISIBLE_DEVICES that shows one device is the launcher's per-rank choice (Slurm's
  // --gpus-per-task=1, wrappers that set it from LOCAL_RANK) when it was set for this rank:
  // that device is this rank's own. Inherited unchanged from the launch (CUDA_VISIBLE_DEVICES=0
  // torchrun ...), it shows every local rank the same device, which they then share. When the
  // parent's environment cannot be read (Slurm's slurmstepd runs as root), it is taken as this
  // rank's own, as Slurm's binding sets it; the communicator's cross-rank check
  // (comm/gpu_assignment.h) names the ranks should they share it after all.
  const bool one_visible = cuda && count == 1 && machine.cuda_visible_devices.has_value();
  const Origin visible_origin =
      origin_of(machine.cuda_visible_devices == parent.cuda_visible_devices, parent);
  const bool shared_visible_device = one_visible && visible_origin == Origin::kInherited;
  const bool own_visible_device = one_visible && !shared_visible_device;

  DeviceChoice d;
  if (config.device) {
    d.ordinal = *config.device;
    d.reason = cat("from ", kDevice, "=", *config.device);
  } else if (local.rank) {
    d.ordinal = *local.rank;
    d.reason = cat("from ", kLocalRank, "=", *local.rank, " (", kDevice, " unset)");
    if (cuda && d.ordinal >= count && one_visible) {
      d.ordinal = 0;
      d.reason = cat("the one device ", visible_text(machine),
                     shared_visible_device ? " shows every local rank" : " shows this rank", " (",
                     kLocalRank, "=", *local.rank, ", ", kDevice, " unset)");
    }
  } else {
    d.reason = cat("neither ", kDevice, " nor ", kLocalRank, " is set");
  }
  if (!cuda) return d;  // the host backend's "device" is this rank's share of RAM

  if (d.ordinal >= count) {
    if (!config.device && local.rank) {
      return absl::InvalidArgumentError(
          cat(kLocalRank, "=", *local.rank, " picks CUDA device ", *local.rank, " (", kDevice,
              " is unset), but ", devices_text(count), " (", visible_text(machine),
              "): run at most ", count, " rank", count == 1 ? "" : "s",
              " per node, show each rank its own device with CUDA_VISIBLE_DEVICES, or set ",
              kDevice, " to share one (its memory is then divided among the ranks)"));
    }
    return absl::InvalidArgumentError(cat(kDevice, "=", d.ordinal, " but ", devices_text(count),
                                          " (", visible_text(machine), "): use 0..", count - 1));
  }

  // How many local ranks use this device.
  if (ranks == 1) return d;
  if (shared_visible_device) {
    d.sharing = ranks;
    d.sharing_reason = cat(visible_text(machine), " is inherited from the launch (",
                           parent_text(parent), ", has it too), so it shows all ", kLocalWorldSize,
                           "=", ranks, " ranks the same one device");
  } else if (own_visible_device) {
    d.sharing_reason =
        visible_origin == Origin::kPerRank
            ? cat(visible_text(machine),
                  " shows this rank one device of its own (set for this rank: ",
                  parent_text(parent), ", has ",
                  parent_value("CUDA_VISIBLE_DEVICES", parent.cuda_visible_devices), ")")
            : cat(visible_text(machine),
                  " shows this rank one device, taken as its own (whether the launcher set it per "
                  "rank is unknown: ",
                  parent.problem.empty() ? std::string("the parent process was not probed")
                                         : parent.problem,
                  ")");
  } else if (!config.device && local.rank) {
    d.sharing_reason = cat(kLocalRank, " gives each of the ", kLocalWorldSize, "=", ranks,
                           " ranks its own device");
  } else if (!config.device) {
    d.sharing = ranks;
    d.sharing_reason =
        cat(kLocalRank, " is unset, so all ", kLocalWorldSize, "=", ranks, " ranks use device 0");
  } else if (origin_of(parent_device(parent) == config.device, parent) == Origin::kInherited) {
    // The launch gave every local rank this STRATA_DEVICE.
    d.sharing = ranks;
    d.sharing_reason = cat(kDevice, "=", *config.device, " is inherited from the launch (",
                           parent_text(parent), ", has it too), so all ", kLocalWorldSize, "=",
                           ranks, " ranks use device ", *config.device);
  } else {
    // Set per rank (or unknown): the others' STRATA_DEVICE is unknown here; with more ranks than
    // devices, some device has at least this many (more than that is caught by the
    // communicator's check).
    d.sharing = (ranks + count - 1) / count;
    d.sharing_reason =
        cat(kDevice, " is set and ", kLocalWorldSize, "=", ranks, " ranks share ", count,
            " visible CUDA device", count == 1 ? "" : "s", ": at least ", d.sharing, " per device");
  }
  return d;
}

}  // namespace strata
