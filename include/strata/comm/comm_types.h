// Element types, reductions and operation names shared by every collective backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

enum class DataType : uint8_t { kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64 };

size_t element_size(DataType type);
// "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64".
std::string_view to_string(DataType type);

// kAverage divides the sum by the rank count (NCCL's ncclAvg; on Gloo a scale after the sum).
enum class ReduceOp : uint8_t { kSum, kAverage, kMax, kMin };

// "sum", "average", "max", "min".
std::string_view to_string(ReduceOp op);

enum class CollectiveKind : uint8_t {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier
};

// "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier".
std::string_view to_string(CollectiveKind kind);

}  // namespace strata
