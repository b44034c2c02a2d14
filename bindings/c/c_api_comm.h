// The communicator behind strata_communicator_t, shared with the ZeRO engine (c_api_zero.cc):
// an engine holds the Communicator too, so it outlives the handle while an engine uses it.
#pragma once

#include <memory>

#include "c_api_internal.h"
#include "strata/comm/communicator.h"

namespace strata::c_api {

struct CommState final : Child {
  void destroy_payload() override { comm.reset(); }
  std::shared_ptr<Communicator> comm;
};

static_assert(static_cast<int>(CollectiveKind::kAllGather) == STRATA_COLLECTIVE_ALL_GATHER);
static_assert(static_cast<int>(CollectiveKind::kReduceScatter) == STRATA_COLLECTIVE_REDUCE_SCATTER);
static_assert(static_cast<int>(CollectiveKind::kAllReduce) == STRATA_COLLECTIVE_ALL_REDUCE);
static_assert(static_cast<int>(CollectiveKind::kBroadcast) == STRATA_COLLECTIVE_BROADCAST);
static_assert(static_cast<int>(CollectiveKind::kBarrier) == STRATA_COLLECTIVE_BARRIER);

// The communicator behind a handle, after entering it (and its runtime) for this call.
absl::StatusOr<CommState*> comm_of(Call& call, strata_communicator_t* handle,
                                   absl::string_view param);

}  // namespace strata::c_api
