// A key-value store that another program serves for this job: torchrun's agent store (the
// torch TCPStore on MASTER_ADDR:MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True) or the store of
// an initialised torch.distributed. strata does not bind that port; it joins through the store:
// rank 0 serves strata's own rendezvous on a free port and announces its address there, and
// the other ranks read it (comm/rendezvous_address.h has the keys). Only a set and a bounded get
// are needed, so any store with those can be adapted (the Python module adapts torch's
// `torch.distributed.Store`; C++ callers can adapt theirs).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <chrono>
#include <string>

namespace strata {

class LauncherStore {
 public:
  virtual ~LauncherStore() = default;
  virtual absl::Status set(const std::string& key, const std::string& value) = 0;
  // The value of `key` once some rank has set it. DeadlineExceeded after `timeout`; another
  // error (the store's server gone) as soon as it is known.
  virtual absl::StatusOr<std::string> get(const std::string& key,
                                          std::chrono::milliseconds timeout) = 0;
  // What the store is, for messages: "torchrun's agent store at 10.0.0.1:29500".
  virtual std::string description() const = 0;
};

}  // namespace strata
