/* strata's C API: the runtime, its tensors and streams, the offload optimizer, and data-parallel
 * training (a communicator and the ZeRO engine), for C programs and for other languages'
 * bindings. Plain C11; also compiles as C++.
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

/* Raised when a struct's layout changes (a program must be rebuilt against the new header).
 * 2: the overlapped step's fields in strata_optimizer_options_t (and so strata_zero_options_t),
 * strata_step_result_t and strata_optimizer_stats_t. */
#define STRATA_C_API_VERSION 2

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
  STRATA_ACCESS_WRITE = 1, /* this copy becomes the newest; the others become stale */
  /* As WRITE, but the caller writes every byte before reading any: nothing is fetched into the
     tier first (its contents are undefined until written). */
  STRATA_ACCESS_OVERWRITE = 2
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
/* The tensor's bytes are no longer needed (an activation backward has read, a gradient after the
 * optimizer step): its copies become stale and go without a write-back; its contents are
 * undefined until next written. STRATA_FAILED_PRECONDITION while it is acquired. */
STRATA_API strata_status_t strata_tensor_discard(strata_tensor_t tensor);

/* ---- Offload optimizer (ZeRO-Offload / ZeRO-Infinity) -----------------------------------------
 */

/* Adam/AdamW with fp32 master weights and moments in the pinned CPU tier or on NVMe, stepped on
 * the CPU; see include/strata/optimizer/offload_optimizer.h for the step's pipeline and its data
 * safety (a step applies completely or not at all). Belongs to one runtime. */
typedef struct strata_optimizer strata_optimizer_t; /* opaque */

typedef int32_t strata_param_type_t; /* the parameter copy the model computes with */
enum { STRATA_PARAM_F32 = 0, STRATA_PARAM_F16 = 1, STRATA_PARAM_BF16 = 2 };
typedef int32_t strata_grad_type_t;
enum { STRATA_GRAD_F32 = 0, STRATA_GRAD_F16 = 1, STRATA_GRAD_BF16 = 2 };
typedef int32_t strata_cpu_isa_t; /* the CPU Adam kernel: AUTO picks the best the CPU has */
enum {
  STRATA_CPU_ISA_AUTO = 0,
  STRATA_CPU_ISA_SCALAR = 1,
  STRATA_CPU_ISA_AVX2 = 2,
  STRATA_CPU_ISA_AVX512 = 3
};

/* One parameter group's hyper-parameters (torch's param_groups). */
typedef struct strata_adam_group {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  int32_t decoupled; /* 1: AdamW; 0: Adam with L2 weight decay */
} strata_adam_group_t;

/* fp16 loss scaling, as torch.cuda.amp.GradScaler: gradients arrive multiplied by `scale`. */
typedef struct strata_loss_scaling {
  float scale;
  int32_t dynamic; /* 1: an overflow backs off, growth_interval clean steps grow */
  float growth_factor;
  float backoff_factor;
  uint32_t growth_interval;
  float min_scale;
} strata_loss_scaling_t;

/* The overlapped step (OverlapOptions in offload_optimizer.h): each parameter's Adam runs as its
 * gradient of the step is final, during backward; step() keeps the work or rolls it back and
 * redoes it (clipping, overflow, a later landing): bitwise the plain step. */
typedef struct strata_overlap_options {
  int32_t enabled;         /* 1: on */
  uint64_t max_host_bytes; /* cap on its backups and held copies in the CPU tier; 0: none */
} strata_overlap_options_t;

typedef struct strata_optimizer_options {
  strata_tier_t state_home;     /* STRATA_TIER_CPU or STRATA_TIER_NVME */
  strata_adam_group_t defaults; /* group 0 */
  float max_grad_norm;          /* > 0: clip the global L2 norm of the gradients to this */
  int32_t skip_on_overflow;     /* 1: an inf/nan gradient skips the step */
  strata_loss_scaling_t loss_scaling;
  uint64_t chunk_elements; /* elements per pipeline chunk; 0: from the staging chunk size */
  strata_cpu_isa_t isa;
  strata_overlap_options_t overlap;
} strata_optimizer_options_t;

/* Fill the structs with the defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, AdamW; states in the
 * CPU tier; no clipping; scale 1). */
STRATA_API strata_status_t strata_adam_group_init(strata_adam_group_t* group);
STRATA_API strata_status_t strata_optimizer_options_init(strata_optimizer_options_t* options);

typedef struct strata_param {
  uint32_t index;
} strata_param_t;

typedef struct strata_param_spec {
  const char* name;      /* unique; the optimizer's own tensors are named "<name>.master" etc. */
  strata_tensor_t param; /* `count` elements of `param_type`, the copy the model computes with */
  strata_tensor_t grad;  /* `count` elements of `grad_type`, written by backward */
  strata_param_type_t param_type;
  strata_grad_type_t grad_type;
  uint64_t count;
  uint32_t group;
  /* NULL, or `count` initial fp32 master weights (copied); NULL widens the parameter tensor's
   * contents. The parameter tensor is then set to the rounded master. */
  const float* initial_master;
} strata_param_spec_t;

typedef struct strata_step_result {
  int32_t skipped;  /* an inf/nan gradient: nothing was updated, the gradients dropped */
  double grad_norm; /* global L2 norm of the unscaled gradients, before clipping */
  double clip_coef; /* factor the gradients were multiplied by (1: no clipping) */
  uint64_t params_updated;
  uint64_t step;    /* optimizer steps taken so far (skipped ones excluded) */
  float loss_scale; /* the scale to use for the next backward */
  /* Overlap: elements whose Adam ran early and held; 1 when early work was rolled back. */
  uint64_t early_elements;
  int32_t rolled_back;
} strata_step_result_t;

typedef struct strata_optimizer_stats_s { /* "_s": strata_optimizer_stats is the function */
  uint64_t steps;
  uint64_t skipped_steps;
  uint64_t failed_steps;
  uint64_t grads_landed; /* strata_optimizer_grad_ready() calls completed */
  uint64_t grad_bytes_landed;
  uint64_t params;
  uint64_t elements;
  uint64_t chunk_elements;
  uint64_t chunks;
  uint64_t last_step_ns;      /* host time of the last step */
  uint64_t last_step_wait_ns; /* of which waiting for gradients still landing */
  uint64_t last_adam_ns;      /* of which running the CPU Adam kernels */
  uint64_t last_nvme_wait_ns; /* of which waiting for NVMe reads/writes */
  uint64_t nvme_bytes_read;
  uint64_t nvme_bytes_written;
  uint64_t peak_staging_chunks; /* pinned staging chunks held at once by one step */
  /* The overlapped step (OffloadOptimizerStats); last_step_ns is then the time exposed after
   * the last gradient. */
  uint64_t overlap_early_steps;   /* steps in which early work was kept */
  uint64_t overlap_rollbacks;     /* steps in which early work was rolled back */
  uint64_t last_early_elements;   /* elements stepped early and kept, last step */
  uint64_t last_redone_elements;  /* elements stepped early, rolled back, stepped again */
  uint64_t last_early_adam_ns;    /* background time of the last step's early work */
  uint64_t last_rollback_ns;      /* of last_step_ns: restoring backups */
  uint64_t last_early_wait_ns;    /* of last_step_ns: waiting for the early stepper */
  uint64_t overlap_host_bytes;    /* backups and held copies allocated */
  uint64_t overlap_budget_misses; /* parameters (chunks) stepped late: over max_host_bytes */
} strata_optimizer_stats_t;

/* `options` may be NULL for the defaults. FAILED_PRECONDITION for states on NVMe without an NVMe
 * tier. Destroyed with its runtime at the latest. */
STRATA_API strata_status_t strata_optimizer_create(strata_runtime_t* runtime,
                                                   const strata_optimizer_options_t* options,
                                                   strata_optimizer_t** out);
STRATA_API strata_status_t strata_optimizer_destroy(strata_optimizer_t* optimizer);

STRATA_API strata_status_t strata_optimizer_add_group(strata_optimizer_t* optimizer,
                                                      const strata_adam_group_t* group,
                                                      uint32_t* out);
/* Changes a group's hyper-parameters between steps. */
STRATA_API strata_status_t strata_optimizer_set_group(strata_optimizer_t* optimizer, uint32_t group,
                                                      const strata_adam_group_t* hyper);
STRATA_API strata_status_t strata_optimizer_get_group(strata_optimizer_t* optimizer, uint32_t group,
                                                      strata_adam_group_t* out);
STRATA_API strata_status_t strata_optimizer_set_loss_scale(strata_optimizer_t* optimizer,
                                                           float scale);
STRATA_API strata_status_t strata_optimizer_loss_scale(strata_optimizer_t* optimizer, float* out);
STRATA_API strata_status_t strata_optimizer_step_count(strata_optimizer_t* optimizer,
                                                       uint64_t* out);

/* Registers a parameter: its master and moment state (moments zero) and its gradient landing
 * buffer. The tensors must belong to the optimizer's runtime. */
STRATA_API strata_status_t strata_optimizer_add_param(strata_optimizer_t* optimizer,
                                                      const strata_param_spec_t* spec,
                                                      strata_param_t* out);
STRATA_API strata_status_t strata_optimizer_find_param(strata_optimizer_t* optimizer,
                                                       const char* name, strata_param_t* out);
STRATA_API strata_status_t strata_optimizer_param_step_count(strata_optimizer_t* optimizer,
                                                             strata_param_t param, uint64_t* out);

/* The parameter's gradient is complete once the work issued so far on `stream` is done. Returns
 * after issuing its copy to the CPU. Several calls before a step accumulate (sum) the gradient.
 * May be called from several threads. */
STRATA_API strata_status_t strata_optimizer_grad_ready(strata_optimizer_t* optimizer,
                                                       strata_param_t param,
                                                       strata_stream_t* stream);
/* With options.overlap: whether this landing completes the parameter's gradient for the step
 * (FINAL: its Adam may start), belongs to a micro-step that later ones add to (MORE), or
 * follows strata_optimizer_set_final_micro_step() (DEFAULT, what grad_ready() passes). A wrong
 * hint never changes a result: a parameter stepped early that lands again is rolled back and
 * stepped in the step; only the early work is lost. */
typedef int32_t strata_grad_completion_t;
enum {
  STRATA_GRAD_COMPLETION_DEFAULT = 0,
  STRATA_GRAD_COMPLETION_FINAL = 1,
  STRATA_GRAD_COMPLETION_MORE = 2
};
STRATA_API strata_status_t strata_optimizer_grad_ready_hint(strata_optimizer_t* optimizer,
                                                            strata_param_t param,
                                                            strata_stream_t* stream,
                                                            strata_grad_completion_t completion);
/* Overlap: whether landings with the DEFAULT hint complete the step's gradients (1, the
 * default, set again by every step) or are micro-steps that later ones add to (0). */
STRATA_API strata_status_t strata_optimizer_set_final_micro_step(strata_optimizer_t* optimizer,
                                                                 int32_t final_micro_step);
/* Overlap: blocks until every early step queued so far has run (tests and benchmarks that
 * separate the early work from the step's; training never needs it). */
STRATA_API strata_status_t strata_optimizer_wait_for_early_steps(strata_optimizer_t* optimizer);
/* Drops every gradient landed since the last step. */
STRATA_API strata_status_t strata_optimizer_zero_grad(strata_optimizer_t* optimizer);
/* Steps every parameter that received a gradient since the last step; `out` may be NULL. The
 * updated parameters are in their tensors for any work issued afterwards. */
STRATA_API strata_status_t strata_optimizer_step(strata_optimizer_t* optimizer,
                                                 strata_step_result_t* out);

/* Checkpoint: states, step counts, hyper-parameters and loss scale into `directory` (created if
 * missing, replaced atomically); load() restores one for the same parameters. */
STRATA_API strata_status_t strata_optimizer_save(strata_optimizer_t* optimizer,
                                                 const char* directory);
STRATA_API strata_status_t strata_optimizer_load(strata_optimizer_t* optimizer,
                                                 const char* directory);

/* Copies the parameter's fp32 state; each of the three arrays holds `count` floats (the
 * parameter's count) or is NULL to skip it. */
STRATA_API strata_status_t strata_optimizer_read_state(strata_optimizer_t* optimizer,
                                                       strata_param_t param, float* master,
                                                       float* exp_avg, float* exp_avg_sq,
                                                       uint64_t count);
STRATA_API strata_status_t strata_optimizer_stats(strata_optimizer_t* optimizer,
                                                  strata_optimizer_stats_t* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The communicator and the ZeRO engine. */
#include "strata/strata_zero.h" /* IWYU pragma: export */

#endif /* STRATA_STRATA_H_ */
