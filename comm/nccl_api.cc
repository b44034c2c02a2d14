#include "nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>

#include "strata/base/text.h"
#include "strata/comm/nccl_library.h"
#include "strata/testing/nccl_library_testing.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

absl::StatusOr<NcclApi> resolve(const NcclSearch& library) {
  if (!library.found()) return library.error;
  NcclApi api{};
  std::string missing;
  auto get = [&](auto& slot, const char* name) {
    void* symbol = dlsym(library.handle, name);
    if (symbol == nullptr) missing += cat(missing.empty() ? "" : ", ", name);
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
  };
  get(api.GetVersion, "ncclGetVersion");
  get(api.GetErrorString, "ncclGetErrorString");
  get(api.GetLastError, "ncclGetLastError");
  get(api.GetUniqueId, "ncclGetUniqueId");
  get(api.CommInitRankConfig, "ncclCommInitRankConfig");
  get(api.CommGetAsyncError, "ncclCommGetAsyncError");
  get(api.CommFinalize, "ncclCommFinalize");
  get(api.CommDestroy, "ncclCommDestroy");
  get(api.CommAbort, "ncclCommAbort");
  get(api.GroupStart, "ncclGroupStart");
  get(api.GroupEnd, "ncclGroupEnd");
  get(api.AllGather, "ncclAllGather");
  get(api.ReduceScatter, "ncclReduceScatter");
  get(api.AllReduce, "ncclAllReduce");
  get(api.Reduce, "ncclReduce");
  get(api.Broadcast, "ncclBroadcast");
  // Optional: Communicator::split makes a new communicator from a unique id without it.
  api.CommSplit = reinterpret_cast<decltype(api.CommSplit)>(dlsym(library.handle, "ncclCommSplit"));
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        to_absl(cat(library.path, " (NCCL ", nccl_version_text(library.version), ") lacks ",
                    missing, ": use NCCL ", nccl_version_text(kMinNcclVersion),
                    " or newer (pip install ", nccl_wheel(), ", or set STRATA_NCCL_LIBRARY)")));
  }
  return api;
}

const absl::StatusOr<NcclApi>& table() {
  static const absl::StatusOr<NcclApi> api = resolve(nccl_library());  // once, thread-safe
  return api;
}

}  // namespace

absl::StatusOr<const NcclApi*> load_nccl_api() {
  const absl::StatusOr<NcclApi>& api = table();
  if (!api.ok()) return api.status();
  return &*api;
}

const NcclApi& nccl() {
  const absl::StatusOr<NcclApi>& api = table();
  if (!api.ok()) std::abort();  // a caller skipped load_nccl_api(): a bug in comm/
  return *api;
}

}  // namespace strata::comm_internal

namespace strata::testing {
namespace {

NcclApiProbe probe(const comm_internal::NcclApi& api) {
  NcclApiProbe out;
  api.GetVersion(&out.version);
  out.no_error = api.GetErrorString(ncclSuccess);
  out.has_split = api.CommSplit != nullptr;
  return out;
}

}  // namespace

absl::StatusOr<NcclApiProbe> probe_nccl_api(const NcclSearch& search) {
  absl::StatusOr<comm_internal::NcclApi> api = comm_internal::resolve(search);
  if (!api.ok()) return api.status();
  return probe(*api);
}

absl::StatusOr<NcclApiProbe> probe_loaded_nccl_api() {
  absl::StatusOr<const comm_internal::NcclApi*> api = comm_internal::load_nccl_api();
  if (!api.ok()) return api.status();
  return probe(**api);
}

}  // namespace strata::testing
