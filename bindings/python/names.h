// Names Python uses for strata's enums: tiers, access modes and dtypes (torch's spellings, numpy
// dtypes and torch.dtype objects accepted).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dlpack.h"
#include "strata/store/tensor_store.h"
#include "strata/store/tier.h"

namespace strata::python {

TierKind parse_tier(const std::string& text, bool allow_nvme);
std::string tier_name(TierKind kind);
AccessMode parse_mode(const std::string& text);

struct DType {
  std::string name;  // torch's spelling
  DLDataType dl;
  uint32_t itemsize;
};

const std::vector<DType>& dtypes();
const DType& uint8_dtype();  // what find() reports for a tensor Python did not create
const DType& dtype_named(const std::string& name);  // one of dtypes(), by its name
DType parse_dtype(const pybind11::handle& object);

// A byte count argument: an int or a size string ("32MiB"); 0 only where `allow_zero`. `what`
// names the argument in the error.
uint64_t size_arg(const pybind11::object& value, const char* what, bool allow_zero = false);

}  // namespace strata::python
