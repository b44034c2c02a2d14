// Element-wise reductions over host memory, for the Gloo backend: Gloo runs the algorithms and
// calls these to combine what it receives. float16 and bfloat16 are combined in float and
// rounded back (to nearest even), as NCCL does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/comm/comm_types.h"

namespace strata::comm_internal {

// x[i] = x[i] op y[i] for n elements of `type`. kAverage combines as a sum (scale afterwards).
using CombineFn = void (*)(void* x, const void* y, size_t n);
CombineFn combine_function(DataType type, ReduceOp op);

// data[i] /= divisor for n elements (the average's final step; integers divide exactly).
void divide_in_place(void* data, size_t n, DataType type, int divisor);

// Storage types for the 16-bit floats (Gloo's algorithms are templated on the element type).
struct Float16Bits {
  uint16_t bits;
};
struct BFloat16Bits {
  uint16_t bits;
};

float to_float(Float16Bits h);
float to_float(BFloat16Bits h);
Float16Bits to_float16(float f);
BFloat16Bits to_bfloat16(float f);

}  // namespace strata::comm_internal
