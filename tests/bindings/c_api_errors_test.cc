// The C API: every call with bad arguments (NULL, null or forged handles, wrong tiers, modes,
// dtypes and shapes, handles of another runtime, use after destroy) returns an error code and a
// message naming the problem.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "c_api_fixtures.h"
#include "strata/strata.h"

namespace strata::testing {
namespace {

TEST_CASE("c_api: every call with bad arguments returns an error code and a message", "[c_api]") {
  TestRuntime rt;
  TestRuntime other;
  strata_runtime_t* r = rt.runtime;
  strata_stream_t* s = nullptr;
  strata_stream_t* foreign_stream = nullptr;
  REQUIRE_OK(strata_stream_create(r, &s));
  REQUIRE_OK(strata_stream_create(other.runtime, &foreign_stream));
  strata_tensor_t t{};
  REQUIRE_OK(strata_tensor_create(r, "w", 4 * kKiB, STRATA_TIER_CPU, &t));
  strata_tensor_t foreign{};
  REQUIRE_OK(strata_tensor_create(other.runtime, "w", 4 * kKiB, STRATA_TIER_CPU, &foreign));
  const strata_tensor_t null_tensor{};
  void* p = nullptr;
  strata_stats_t stats;
  strata_tensor_info_t info;
  strata_tensor_t found{};

  SECTION("NULL handles and NULL outputs") {
    expect_error(strata_runtime_destroy(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_destroy: runtime is NULL");
    expect_error(strata_runtime_describe(nullptr, nullptr, 0, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_describe: runtime is NULL");
    expect_error(strata_runtime_describe(r, nullptr, 8, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_describe: buffer (with size > 0) is NULL");
    expect_error(strata_runtime_step_begin(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_step_begin: runtime is NULL");
    expect_error(strata_runtime_step_end(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_step_end: runtime is NULL");
    expect_error(strata_runtime_set_access_order(nullptr, nullptr, 0), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: runtime is NULL");
    expect_error(strata_runtime_set_access_order(r, nullptr, 3), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order (with count > 0) is NULL");
    expect_error(strata_runtime_flush(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_flush: runtime is NULL");
    expect_error(strata_runtime_stats(r, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_stats: out is NULL");
    expect_error(strata_stream_create(nullptr, &s), STRATA_INVALID_ARGUMENT,
                 "strata_stream_create: runtime is NULL");
    CHECK(s == nullptr);
    REQUIRE_OK(strata_stream_create(r, &s));
    expect_error(strata_stream_create(r, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_stream_create: out is NULL");
    expect_error(strata_stream_synchronize(nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_stream_synchronize: stream is NULL");
    expect_error(strata_tensor_create(nullptr, "x", 1, STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_create: runtime is NULL");
    expect_error(strata_tensor_create(r, nullptr, 1, STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_create: name is NULL");
    expect_error(strata_tensor_create(r, "x", 1, STRATA_TIER_CPU, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create: out is NULL");
    expect_error(
        strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, nullptr, 2, STRATA_TIER_CPU, &found),
        STRATA_INVALID_ARGUMENT, "strata_tensor_create_ex: shape (with ndim > 0) is NULL");
    expect_error(strata_tensor_find(r, nullptr, &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_find: name is NULL");
    expect_error(strata_tensor_find(nullptr, "w", &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_find: runtime is NULL");
    expect_error(strata_tensor_find(r, "w", nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_find: out is NULL");
    expect_error(strata_tensor_info(t, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: out is NULL");
    expect_error(strata_tensor_name(t, nullptr, 4, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_name: buffer (with size > 0) is NULL");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, nullptr, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_acquire: stream is NULL");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, nullptr),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_acquire: out is NULL");
    expect_error(strata_tensor_release(t, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_release: stream is NULL");
  }

  SECTION("null tensor handles") {
    const std::string null_text = "tensor is a null handle";
    expect_error(strata_tensor_destroy(null_tensor), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_destroy: " + null_text);
    expect_error(strata_tensor_info(null_tensor, &info), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: " + null_text);
    expect_error(strata_tensor_name(null_tensor, nullptr, 0, nullptr), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_name: " + null_text);
    expect_error(strata_tensor_acquire(null_tensor, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_acquire: " + null_text);
    CHECK(p == nullptr);
    expect_error(strata_tensor_release(null_tensor, s), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_release: " + null_text);
    expect_error(strata_tensor_prefetch(null_tensor, STRATA_TIER_GPU), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_prefetch: " + null_text);
    expect_error(strata_tensor_evict(null_tensor, STRATA_TIER_GPU), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_evict: " + null_text);
    expect_error(strata_tensor_discard(null_tensor), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_discard: " + null_text);
    const strata_access_t order[] = {{t, STRATA_TIER_GPU}, {null_tensor, STRATA_TIER_GPU}};
    expect_error(strata_runtime_set_access_order(r, order, 2), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order[1].tensor is a null handle");
  }

  SECTION("wrong tiers, modes, dtypes and shapes") {
    expect_error(strata_tensor_create(r, "x", 64, 3, &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create: home is 3: use STRATA_TIER_GPU (0), STRATA_TIER_CPU (1) "
                 "or STRATA_TIER_NVME (2)");
    expect_error(strata_tensor_create(r, "x", 64, STRATA_TIER_NVME, &found),
                 STRATA_FAILED_PRECONDITION,
                 "strata_tensor_create: tensor 'x': home tier nvme, but this runtime has no NVMe "
                 "tier; set STRATA_NVME_PATHS");
    expect_error(strata_tensor_create(r, "x", 0, STRATA_TIER_CPU, &found), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create: tensor 'x': size must be > 0");
    expect_error(strata_tensor_create(r, "w", 64, STRATA_TIER_CPU, &found), STRATA_ALREADY_EXISTS,
                 "strata_tensor_create: a tensor named 'w' already exists");
    expect_error(strata_tensor_create(r, "huge", uint64_t{1} << 40, STRATA_TIER_CPU, &found),
                 STRATA_RESOURCE_EXHAUSTED, "strata_tensor_create: creating tensor 'huge'");
    const int64_t bad_dim[] = {4, -2};
    expect_error(
        strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, bad_dim, 2, STRATA_TIER_CPU, &found),
        STRATA_INVALID_ARGUMENT,
        "strata_tensor_create_ex: shape[1] is -2: dimensions must be >= 0");
    const int64_t dims[] = {4, 4};
    expect_error(strata_tensor_create_ex(r, "x", 42, dims, 2, STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT,
                 "strata_tensor_create_ex: dtype is 42: use one of the STRATA_DTYPE_* values");
    expect_error(strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, dims, STRATA_MAX_NDIM + 1,
                                         STRATA_TIER_CPU, &found),
                 STRATA_INVALID_ARGUMENT, "strata_tensor_create_ex: ndim is 9");
    const int64_t overflow[] = {int64_t{1} << 40, int64_t{1} << 40};
    expect_error(
        strata_tensor_create_ex(r, "x", STRATA_DTYPE_FLOAT32, overflow, 2, STRATA_TIER_CPU, &found),
        STRATA_INVALID_ARGUMENT, "strata_tensor_create_ex: the shape's size in bytes");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_NVME, s, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: acquire needs the gpu or cpu tier");
    expect_error(strata_tensor_acquire(t, -1, s, STRATA_ACCESS_READ, &p), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: tier is -1");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_GPU, s, 3, &p), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: mode is 3: use STRATA_ACCESS_READ (0), "
                 "STRATA_ACCESS_WRITE (1) or STRATA_ACCESS_OVERWRITE (2)");
    expect_error(strata_tensor_prefetch(t, STRATA_TIER_NVME), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_prefetch: prefetch targets the gpu or cpu tier");
    expect_error(strata_tensor_prefetch(t, 1000), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_prefetch: tier is 1000");
    expect_error(strata_tensor_evict(t, STRATA_TIER_CPU), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_evict: tensor 'w': its home copy (cpu) is never evicted");
    expect_error(strata_tensor_evict(t, 7), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_evict: tier is 7");
    REQUIRE(strata_tensor_acquire(t, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p) == STRATA_OK);
    expect_error(strata_tensor_discard(t), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_discard: tensor 'w' is acquired; release it before discarding");
    REQUIRE(strata_tensor_release(t, s) == STRATA_OK);
    CHECK(strata_tensor_discard(t) == STRATA_OK);
    const strata_access_t order[] = {{t, STRATA_TIER_NVME}};
    expect_error(strata_runtime_set_access_order(r, order, 1), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: the access order names gpu or cpu acquires");
    const strata_access_t bad_tier[] = {{t, 9}};
    expect_error(strata_runtime_set_access_order(r, bad_tier, 1), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order[0].tier is 9");
    expect_error(strata_tensor_find(r, "nope", &found), STRATA_NOT_FOUND,
                 "strata_tensor_find: no tensor named 'nope'");
  }

  SECTION("release without acquire, and acquired tensors") {
    expect_error(strata_tensor_release(t, s), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_release: tensor 'w' is not acquired: release without acquire");
    REQUIRE_OK(strata_tensor_acquire(t, STRATA_TIER_GPU, s, STRATA_ACCESS_READ, &p));
    CHECK(p != nullptr);
    expect_error(strata_tensor_destroy(t), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_destroy: tensor 'w' is acquired 1 time(s)");
    expect_error(strata_tensor_evict(t, STRATA_TIER_GPU), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_evict: tensor 'w' is acquired in the gpu tier");
    REQUIRE_OK(strata_tensor_release(t, s));
    expect_error(strata_tensor_release(t, s), STRATA_FAILED_PRECONDITION,
                 "strata_tensor_release: tensor 'w' is not acquired");
  }

  SECTION("handles of another runtime, or of another kind") {
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, foreign_stream, STRATA_ACCESS_READ, &p),
                 STRATA_INVALID_ARGUMENT,
                 "strata_tensor_acquire: stream belongs to another runtime than tensor");
    expect_error(strata_tensor_release(foreign, s), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_release: stream belongs to another runtime than tensor");
    const strata_access_t order[] = {{foreign, STRATA_TIER_GPU}};
    expect_error(strata_runtime_set_access_order(r, order, 1), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_set_access_order: order[0].tensor belongs to another runtime");
    auto* stream_as_runtime = reinterpret_cast<strata_runtime_t*>(s);
    expect_error(strata_runtime_flush(stream_as_runtime), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_flush: runtime is a stream handle, not a runtime handle");
    auto* runtime_as_stream = reinterpret_cast<strata_stream_t*>(r);
    expect_error(strata_stream_synchronize(runtime_as_stream), STRATA_INVALID_ARGUMENT,
                 "strata_stream_synchronize: stream is a runtime handle, not a stream handle");
    expect_error(strata_stream_destroy(runtime_as_stream), STRATA_INVALID_ARGUMENT,
                 "strata_stream_destroy: stream is a runtime handle, not a stream handle");
    auto* made_up = reinterpret_cast<strata_runtime_t*>(uintptr_t{0xdeadbeef0000});
    expect_error(strata_runtime_stats(made_up, &stats), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_stats: runtime is not a runtime handle that strata returned");
    expect_error(strata_runtime_destroy(made_up), STRATA_INVALID_ARGUMENT,
                 "strata_runtime_destroy: runtime is not a runtime handle that strata returned");
    strata_tensor_t forged = t;
    forged.runtime = 0xdeadbeef0000;
    expect_error(strata_tensor_info(forged, &info), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: tensor is not a tensor handle strata returned");
    forged = t;
    forged.index = 12345;
    expect_error(strata_tensor_info(forged, &info), STRATA_INVALID_ARGUMENT,
                 "strata_tensor_info: not a tensor of this store");
    forged = t;
    forged.generation += 1;
    expect_error(strata_tensor_info(forged, &info), STRATA_NOT_FOUND,
                 "strata_tensor_info: the tensor was destroyed (stale handle)");
  }

  SECTION("use after destroy") {
    REQUIRE_OK(strata_tensor_destroy(t));
    expect_error(strata_tensor_destroy(t), STRATA_NOT_FOUND,
                 "strata_tensor_destroy: the tensor was destroyed (stale handle)");
    expect_error(strata_tensor_acquire(t, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p),
                 STRATA_NOT_FOUND, "strata_tensor_acquire: the tensor was destroyed");
    // A new tensor in the same slot does not revive the old handle.
    REQUIRE_OK(strata_tensor_create(r, "w", 4 * kKiB, STRATA_TIER_CPU, &found));
    CHECK(found.index == t.index);
    expect_error(strata_tensor_info(t, &info), STRATA_NOT_FOUND,
                 "strata_tensor_info: the tensor was destroyed (stale handle)");
    REQUIRE_OK(strata_tensor_info(found, &info));

    REQUIRE_OK(strata_stream_destroy(s));
    expect_error(strata_stream_destroy(s), STRATA_NOT_FOUND,
                 "strata_stream_destroy: stream was destroyed");
    expect_error(strata_stream_synchronize(s), STRATA_NOT_FOUND,
                 "strata_stream_synchronize: stream was destroyed");
    expect_error(strata_tensor_acquire(found, STRATA_TIER_CPU, s, STRATA_ACCESS_READ, &p),
                 STRATA_NOT_FOUND, "strata_tensor_acquire: stream was destroyed");

    REQUIRE_OK(strata_runtime_destroy(r));
    rt.runtime = nullptr;
    const std::string gone = "runtime was destroyed";
    expect_error(strata_runtime_destroy(r), STRATA_NOT_FOUND, "strata_runtime_destroy: " + gone);
    expect_error(strata_runtime_stats(r, &stats), STRATA_NOT_FOUND,
                 "strata_runtime_stats: " + gone);
    expect_error(strata_runtime_flush(r), STRATA_NOT_FOUND, "strata_runtime_flush: " + gone);
    expect_error(strata_runtime_step_begin(r), STRATA_NOT_FOUND,
                 "strata_runtime_step_begin: " + gone);
    expect_error(strata_runtime_step_end(r), STRATA_NOT_FOUND, "strata_runtime_step_end: " + gone);
    expect_error(strata_runtime_set_access_order(r, nullptr, 0), STRATA_NOT_FOUND,
                 "strata_runtime_set_access_order: " + gone);
    expect_error(strata_runtime_describe(r, nullptr, 0, nullptr), STRATA_NOT_FOUND,
                 "strata_runtime_describe: " + gone);
    expect_error(strata_stream_create(r, &s), STRATA_NOT_FOUND, "strata_stream_create: " + gone);
    expect_error(strata_tensor_create(r, "y", 64, STRATA_TIER_CPU, &found), STRATA_NOT_FOUND,
                 "strata_tensor_create: " + gone);
    expect_error(strata_tensor_find(r, "w", &found), STRATA_NOT_FOUND,
                 "strata_tensor_find: " + gone);
    const std::string orphan = "tensor belongs to a runtime that was destroyed";
    expect_error(strata_tensor_info(t, &info), STRATA_NOT_FOUND, "strata_tensor_info: " + orphan);
    expect_error(strata_tensor_evict(t, STRATA_TIER_GPU), STRATA_NOT_FOUND,
                 "strata_tensor_evict: " + orphan);
    expect_error(strata_tensor_prefetch(t, STRATA_TIER_GPU), STRATA_NOT_FOUND,
                 "strata_tensor_prefetch: " + orphan);
    expect_error(strata_tensor_destroy(t), STRATA_NOT_FOUND, "strata_tensor_destroy: " + orphan);
  }

  SECTION("a runtime's destroy ends its streams and leaves other runtimes alone") {
    REQUIRE_OK(strata_tensor_acquire(t, STRATA_TIER_GPU, s, STRATA_ACCESS_WRITE, &p));
    REQUIRE_OK(strata_runtime_destroy(r));  // with a stream and an acquired tensor
    rt.runtime = nullptr;
    expect_error(strata_stream_synchronize(s), STRATA_NOT_FOUND,
                 "strata_stream_synchronize: stream was destroyed");
    expect_error(strata_tensor_release(t, s), STRATA_NOT_FOUND,
                 "strata_tensor_release: tensor belongs to a runtime that was destroyed");
    REQUIRE_OK(strata_tensor_info(foreign, &info));
    REQUIRE_OK(strata_stream_synchronize(foreign_stream));
  }
}

}  // namespace
}  // namespace strata::testing
