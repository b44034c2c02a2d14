// Test hook for the check of ranks sharing a GPU (comm/gpu_assignment.h): communicators created
// while a GPU is simulated post it as this process's GPU, on any device — the host backend's
// included, whose "device" is host memory and never shared — so that ranks on a machine without
// a GPU can claim one GPU together. What their arenas assumed is still the device's own
// (Device::set_budget_sharing).
#pragma once

#include <optional>
#include <string>

namespace strata::testing {

struct SimulatedGpu {
  std::string pci_bus_id;  // "0000:3b:00.0"; ranks of one machine that give the same share it
  int ordinal = 0;         // the CUDA ordinal messages name
};

// Process-wide; nullopt ends the simulation.
void simulate_gpu_for_testing(std::optional<SimulatedGpu> gpu);

}  // namespace strata::testing
