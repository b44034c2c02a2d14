// The environment a Python Runtime is built from: the STRATA_* variables of os.environ and
// LOCAL_RANK / LOCAL_WORLD_SIZE (which pick the device and divide the node's memory), with
// Runtime(**overrides) applied (gpu_bytes="64MiB" sets STRATA_GPU_BYTES; None unsets), and
// those of a Communicator.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>

namespace strata::python {

std::map<std::string, std::string> runtime_variables(const pybind11::kwargs& overrides);

// What Communicator.from_environment(**overrides) is built from: the launch variables (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and the STRATA_* variables of os.environ,
// with the keywords applied: rank=1 sets RANK, comm_timeout="30s" sets STRATA_COMM_TIMEOUT;
// None unsets.
struct CommVariables {
  std::map<std::string, std::string> launch;
  std::map<std::string, std::string> strata;
};
CommVariables communicator_variables(const pybind11::kwargs& overrides);

}  // namespace strata::python
