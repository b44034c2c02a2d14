// The NCCL functions strata calls, resolved with dlsym from the library that nccl_library()
// loaded (never linked: see strata/comm/nccl_library.h). Private to comm/'s NCCL backend.
#pragma once

#include <absl/status/statusor.h>
#include <nccl.h>

namespace strata::comm_internal {

struct NcclApi {
  decltype(&::ncclGetVersion) GetVersion;
  decltype(&::ncclGetErrorString) GetErrorString;
  decltype(&::ncclGetLastError) GetLastError;
  decltype(&::ncclGetUniqueId) GetUniqueId;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&::ncclCommFinalize) CommFinalize;
  decltype(&::ncclCommDestroy) CommDestroy;
  decltype(&::ncclCommAbort) CommAbort;
  decltype(&::ncclGroupStart) GroupStart;
  decltype(&::ncclGroupEnd) GroupEnd;
  decltype(&::ncclAllGather) AllGather;
  decltype(&::ncclReduceScatter) ReduceScatter;
  decltype(&::ncclAllReduce) AllReduce;
  decltype(&::ncclReduce) Reduce;
  decltype(&::ncclBroadcast) Broadcast;
  // Optional (NCCL 2.18 and newer): null where the library lacks it.
  decltype(&::ncclCommSplit) CommSplit;
};

// The table, resolved once on first call; an error says what was searched and the fix, or
// names the function the library lacks.
absl::StatusOr<const NcclApi*> load_nccl_api();

// The table, once load_nccl_api() has succeeded (the communicator exists only then).
const NcclApi& nccl();

}  // namespace strata::comm_internal
