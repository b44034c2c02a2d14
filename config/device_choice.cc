// choose_device(): which GPU this rank uses (STRATA_DEVICE, else LOCAL_RANK, else 0) and how
// many local ranks are taken to share it, for the budgets of resolve().
#include <absl/status/status.h>

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

}  // namespace

absl::StatusOr<DeviceChoice> choose_device(const Config& config, const MachineInfo& machine) {
  const bool cuda = machine.backend == Backend::kCuda;
  const LocalRanks& local = config.local;
  const int ranks = local.count();
  const int count = machine.gpu_count;
  // A CUDA_VISIBLE_DEVICES that shows one device is taken as the launcher's per-rank choice
  // (Slurm's --gpus-per-task=1, wrappers that set it from LOCAL_RANK): that device is this
  // rank's own. If every rank was shown the same one, the communicator's cross-rank check names
  // them, and a GPU arena that does not fit fails with an error naming STRATA_GPU_BYTES.
  const bool own_visible_device = cuda && count == 1 && machine.cuda_visible_devices.has_value();

  DeviceChoice d;
  if (config.device) {
    d.ordinal = *config.device;
    d.reason = cat("from ", kDevice, "=", *config.device);
  } else if (local.rank) {
    d.ordinal = *local.rank;
    d.reason = cat("from ", kLocalRank, "=", *local.rank, " (", kDevice, " unset)");
    if (cuda && d.ordinal >= count && own_visible_device) {
      d.ordinal = 0;
      d.reason = cat("the one device ", visible_text(machine), " shows this rank (", kLocalRank,
                     "=", *local.rank, ", ", kDevice, " unset)");
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
  if (own_visible_device) {
    d.sharing_reason = cat(visible_text(machine), " shows this rank one device of its own");
  } else if (!config.device && local.rank) {
    d.sharing_reason = cat(kLocalRank, " gives each of the ", kLocalWorldSize, "=", ranks,
                           " ranks its own device");
  } else if (!config.device) {
    d.sharing = ranks;
    d.sharing_reason =
        cat(kLocalRank, " is unset, so all ", kLocalWorldSize, "=", ranks, " ranks use device 0");
  } else {
    // Other ranks' STRATA_DEVICE is unknown here; with more ranks than devices, some device has
    // at least this many (an explicit constant STRATA_DEVICE shared by all is caught by the
    // communicator's check, and its arena by cudaMalloc).
    d.sharing = (ranks + count - 1) / count;
    d.sharing_reason =
        cat(kDevice, " is set and ", kLocalWorldSize, "=", ranks, " ranks share ", count,
            " visible CUDA device", count == 1 ? "" : "s", ": at least ", d.sharing, " per device");
  }
  return d;
}

}  // namespace strata
