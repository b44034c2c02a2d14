// The CPU Adam pool's thread settings (STRATA_ADAM_THREADS, STRATA_ADAM_RESERVE,
// STRATA_ADAM_PIN), parsed with every other STRATA_* variable so that one place validates them
// all. A dependency-free header: the configuration reads them, offload/cpu_pool.h decides from
// them which CPUs the pool uses (docs/optimizer.md, "Thread placement").
#pragma once

#include <cstdint>

namespace strata {

struct CpuPoolSettings {
  // Threads of the pool, one per CPU; 0: every CPU of the NUMA node that holds the states,
  // less the reserved ones. More than the node has spills onto the other nodes' CPUs.
  uint32_t threads = 0;
  // CPUs of this process's set that the pool leaves free (for the data loader): taken from the
  // chosen node's only as far as the other nodes do not already leave that many.
  uint32_t reserve_cores = 0;
  // Pin the pool's threads to its CPUs (when they are not simply every CPU allowed).
  bool pin = true;
  friend bool operator==(const CpuPoolSettings&, const CpuPoolSettings&) = default;
};

inline constexpr uint32_t kMaxPoolCpus = 1 << 16;

}  // namespace strata
