// strata.Communicator's meeting point when torch owns MASTER_PORT: a LauncherStore
// (include/strata/comm/launcher_store.h) over a Python object with torch.distributed.Store's
// methods (set, wait, get): torchrun's agent store or torch.distributed's default store
// (strata/_launch.py finds them).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "strata/comm/launcher_store.h"

namespace strata::python {

class PyLauncherStore final : public LauncherStore {
 public:
  // `store`: a torch.distributed.Store (or anything with its set/wait/get). Made and destroyed
  // with the GIL held; its calls take the GIL themselves (the rendezvous runs without it).
  PyLauncherStore(pybind11::object store, std::string description)
      : store_(std::move(store)), description_(std::move(description)) {}

  absl::Status set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> get(const std::string& key,
                                  std::chrono::milliseconds timeout) override;
  std::string description() const override { return description_; }

 private:
  pybind11::object store_;
  std::string description_;
};

}  // namespace strata::python
