/* strata's C API: the runtime, its tensors and streams, for C programs and for other
 * languages' bindings. Plain C11; also compiles as C++.
 *
 *   strata_runtime_t* runtime;
 *   if (strata_runtime_create_from_env(&runtime) != STRATA_OK) {
 *     fprintf(stderr, "%s\n", strata_last_error());
 *   }
 *
 * Every call that can fail returns a strata_status_t: STRATA_OK, or a code whose message
 * strata_last_error() gives on the calling thread. No call aborts or throws on bad input: a NULL
 * or destroyed handle, a wrong tier or a release without acquire is an error code. Handles are
 * never reused, so a stale one is always detected. See docs/c_api.md.
 */
#ifndef STRATA_STRATA_H_
#define STRATA_STRATA_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define STRATA_API __attribute__((visibility("default")))
#else
#define STRATA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define STRATA_C_API_VERSION 1

/* ---- Status ------------------------------------------------------------------------------ */

/* The codes are absl::StatusCode's (and gRPC's), with the same numbers. The enum types of this
 * header are fixed-width integers so that an out-of-range value from a caller is an error, not
 * undefined behaviour. */
typedef int32_t strata_status_t;
enum {
  STRATA_OK = 0,
  STRATA_CANCELLED = 1,
  STRATA_UNKNOWN = 2,
  STRATA_INVALID_ARGUMENT = 3,
  STRATA_DEADLINE_EXCEEDED = 4,
  STRATA_NOT_FOUND = 5, /* also: a handle that was destroyed */
  STRATA_ALREADY_EXISTS = 6,
  STRATA_PERMISSION_DENIED = 7,
  STRATA_RESOURCE_EXHAUSTED = 8,
  STRATA_FAILED_PRECONDITION = 9,
  STRATA_ABORTED = 10,
  STRATA_OUT_OF_RANGE = 11,
  STRATA_UNIMPLEMENTED = 12,
  STRATA_INTERNAL = 13,
  STRATA_UNAVAILABLE = 14,
  STRATA_DATA_LOSS = 15,
  STRATA_UNAUTHENTICATED = 16
};

/* The message of the calling thread's last failing call ("" before any failure). The pointer is
 * valid until the thread's next failing call. Never NULL. */
STRATA_API const char* strata_last_error(void);
/* "OK", "INVALID_ARGUMENT", ...; "UNRECOGNIZED" for a value that is not a status code. */
STRATA_API const char* strata_status_name(strata_status_t status);

/* ---- Enumerations ------------------------------------------------------------------------ */

typedef int32_t strata_tier_t;
enum { STRATA_TIER_GPU = 0, STRATA_TIER_CPU = 1, STRATA_TIER_NVME = 2 };
#define STRATA_TIER_COUNT 3

typedef int32_t strata_access_mode_t;
enum {
  STRATA_ACCESS_READ = 0,
  STRATA_ACCESS_WRITE = 1 /* this copy becomes the newest; the others become stale */
};

/* Element types, recorded with a tensor for bindings that need them (DLPack). */
typedef int32_t strata_dtype_t;
enum {
  STRATA_DTYPE_UINT8 = 0, /* raw bytes: what strata_tensor_create() records */
  STRATA_DTYPE_INT8 = 1,
  STRATA_DTYPE_INT16 = 2,
  STRATA_DTYPE_INT32 = 3,
  STRATA_DTYPE_INT64 = 4,
  STRATA_DTYPE_UINT16 = 5,
  STRATA_DTYPE_UINT32 = 6,
  STRATA_DTYPE_UINT64 = 7,
  STRATA_DTYPE_FLOAT16 = 8,
  STRATA_DTYPE_BFLOAT16 = 9,
  STRATA_DTYPE_FLOAT32 = 10,
  STRATA_DTYPE_FLOAT64 = 11,
  STRATA_DTYPE_BOOL = 12
};
#define STRATA_MAX_NDIM 8

/* Bytes per element; 0 for a value that is not a dtype. */
STRATA_API size_t strata_dtype_size(strata_dtype_t dtype);

/* ---- Handles ----------------------------------------------------------------------------- */

typedef struct strata_runtime strata_runtime_t; /* opaque */
typedef struct strata_stream strata_stream_t;   /* opaque; belongs to one runtime */

/* A tensor, by value. Its fields are strata's: copy and compare it, do not fill it in. A
 * zero-initialised handle is null; a destroyed tensor's handle stays invalid for good. */
typedef struct strata_tensor {
  uint64_t runtime;
  uint32_t index;
  uint32_t generation;
} strata_tensor_t;

/* ---- Runtime ----------------------------------------------------------------------------- */

/* A STRATA_* variable (docs/configuration.md). A NULL value unsets it: its default applies
 * even when the environment sets it. */
typedef struct strata_setting {
  const char* name;
  const char* value;
} strata_setting_t;

/* A runtime from the STRATA_* environment variables. Errors name the variable and the value. */
STRATA_API strata_status_t strata_runtime_create_from_env(strata_runtime_t** out);
/* Same, with `settings` overriding the environment; `settings` may be NULL when `count` is 0. */
STRATA_API strata_status_t strata_runtime_create(const strata_setting_t* settings, size_t count,
                                                 strata_runtime_t** out);
/* Destroys the runtime with its tensors, streams and optimizers; their handles become invalid.
 * Waits for calls on it still running in other threads. */
STRATA_API strata_status_t strata_runtime_destroy(strata_runtime_t* runtime);
/* The resolved configuration, one "STRATA_NAME = value" line each, then any warnings. Copies at
 * most size - 1 bytes and a NUL into `buffer` (NULL when size is 0); `*length` (may be NULL)
 * receives the full length without the NUL, so a first call with size 0 tells what to allocate. */
STRATA_API strata_status_t strata_runtime_describe(strata_runtime_t* runtime, char* buffer,
                                                   size_t size, size_t* length);

/* The scheduler: step boundaries, and an order of acquisitions given up front. */
STRATA_API strata_status_t strata_runtime_step_begin(strata_runtime_t* runtime);
STRATA_API strata_status_t strata_runtime_step_end(strata_runtime_t* runtime);
typedef struct strata_access {
  strata_tensor_t tensor;
  strata_tier_t tier; /* STRATA_TIER_GPU or STRATA_TIER_CPU */
} strata_access_t;
STRATA_API strata_status_t strata_runtime_set_access_order(strata_runtime_t* runtime,
                                                           const strata_access_t* order,
                                                           size_t count);
/* Writes every copy newer than its home copy back home, and waits. */
STRATA_API strata_status_t strata_runtime_flush(strata_runtime_t* runtime);

/* ---- Statistics -------------------------------------------------------------------------- */

typedef struct strata_tier_usage {
  int32_t present; /* the runtime has this tier (NVMe only with STRATA_NVME_PATHS) */
  uint64_t capacity;
  uint64_t used;
  uint64_t resident; /* tensors with a valid copy here */
  double fragmentation;
} strata_tier_usage_t;

typedef struct strata_move_stats {
  uint64_t bytes;
  uint64_t moves;
  uint64_t ns; /* host time spent issuing and (where the host waits) completing them */
} strata_move_stats_t;

typedef struct strata_schedule_stats {
  uint64_t steps;
  uint64_t trace_length; /* accesses in the current trace */
  uint64_t acquires;
  uint64_t matched;   /* acquires that were the expected next access */
  uint64_t realigned; /* deviations resolved by jumping to the nearest match */
  uint64_t unknown;   /* acquires of an access not in the trace */
  uint64_t rerecords; /* steps whose order replaced the trace */
  uint64_t late;      /* late arrivals reported */
  int32_t has_trace;
  int32_t given_order; /* the trace came from strata_runtime_set_access_order() */
} strata_schedule_stats_t;

typedef struct strata_stats {
  strata_tier_usage_t tiers[STRATA_TIER_COUNT];                    /* by strata_tier_t */
  strata_move_stats_t moves[STRATA_TIER_COUNT][STRATA_TIER_COUNT]; /* [from][to] */
  uint64_t tensors;
  uint64_t acquires;
  uint64_t hits;     /* the copy was there (and valid) when acquired */
  uint64_t misses;   /* fetched on demand */
  uint64_t stall_ns; /* host time acquires spent waiting for data */
  uint64_t evictions_clean;
  uint64_t evictions_writeback;
  uint64_t errors; /* failed moves */
  uint64_t prefetches_issued;
  uint64_t prefetches_used;   /* a prefetched copy was acquired */
  uint64_t prefetches_late;   /* acquired while still in flight */
  uint64_t prefetches_wasted; /* evicted (or overwritten) before any use */
  uint64_t prefetches_failed; /* dropped: no room without evicting sooner-needed tensors */
  double prefetch_accuracy;   /* used / issued; 0 before any prefetch */
  strata_schedule_stats_t schedule;
} strata_stats_t;

STRATA_API strata_status_t strata_runtime_stats(strata_runtime_t* runtime, strata_stats_t* out);

/* ---- Streams ----------------------------------------------------------------------------- */

/* An ordered queue of device work on the runtime's device (a CUDA stream, or a host worker). */
STRATA_API strata_status_t strata_stream_create(strata_runtime_t* runtime, strata_stream_t** out);
/* Lets queued work finish first, as cudaStreamDestroy does. */
STRATA_API strata_status_t strata_stream_destroy(strata_stream_t* stream);
/* Blocks the calling thread until all work issued on the stream so far is done. */
STRATA_API strata_status_t strata_stream_synchronize(strata_stream_t* stream);

/* ---- Tensors ----------------------------------------------------------------------------- */

/* Registers a tensor of `bytes` bytes (recorded as STRATA_DTYPE_UINT8, shape {bytes}) and
 * reserves its copy in its home tier. Names are unique within a runtime. Contents are undefined
 * until first written. */
STRATA_API strata_status_t strata_tensor_create(strata_runtime_t* runtime, const char* name,
                                                uint64_t bytes, strata_tier_t home,
                                                strata_tensor_t* out);
/* Same, sized by `shape` (`ndim` <= STRATA_MAX_NDIM dimensions, each >= 0; NULL when ndim is 0)
 * and `dtype`, which strata_tensor_info() gives back. */
STRATA_API strata_status_t strata_tensor_create_ex(strata_runtime_t* runtime, const char* name,
                                                   strata_dtype_t dtype, const int64_t* shape,
                                                   size_t ndim, strata_tier_t home,
                                                   strata_tensor_t* out);
/* Fails (STRATA_FAILED_PRECONDITION) while the tensor is acquired. */
STRATA_API strata_status_t strata_tensor_destroy(strata_tensor_t tensor);
STRATA_API strata_status_t strata_tensor_find(strata_runtime_t* runtime, const char* name,
                                              strata_tensor_t* out);

typedef struct strata_tensor_info_s { /* "_s": strata_tensor_info is the function */
  uint64_t bytes;
  strata_tier_t home;
  strata_dtype_t dtype;
  int32_t ndim;
  int64_t shape[STRATA_MAX_NDIM]; /* the first ndim entries; the rest 0 */
} strata_tensor_info_t;
STRATA_API strata_status_t strata_tensor_info(strata_tensor_t tensor, strata_tensor_info_t* out);
/* The tensor's name, copied as strata_runtime_describe() copies text. */
STRATA_API strata_status_t strata_tensor_name(strata_tensor_t tensor, char* buffer, size_t size,
                                              size_t* length);

/* The tensor's address in `tier` (STRATA_TIER_GPU or STRATA_TIER_CPU), ready for work issued on
 * `stream` after the call; a CPU address may be used by the host at once. The copy stays put
 * until released. On failure *out is NULL. */
STRATA_API strata_status_t strata_tensor_acquire(strata_tensor_t tensor, strata_tier_t tier,
                                                 strata_stream_t* stream, strata_access_mode_t mode,
                                                 void** out);
/* The work on `stream` that used the tensor's most recent acquisition has been issued; its
 * memory is reused only after that work is done. */
STRATA_API strata_status_t strata_tensor_release(strata_tensor_t tensor, strata_stream_t* stream);
/* Starts moving the tensor toward `tier` (GPU or CPU) in the background. */
STRATA_API strata_status_t strata_tensor_prefetch(strata_tensor_t tensor, strata_tier_t tier);
/* Drops the copy in `tier`, writing it back home first when it holds the only newest bytes.
 * The home copy is never evicted (STRATA_INVALID_ARGUMENT). */
STRATA_API strata_status_t strata_tensor_evict(strata_tensor_t tensor, strata_tier_t tier);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_STRATA_H_ */
