/* strata's C API, data-parallel training: the communicator (the ranks of a job) and the ZeRO-DP
 * engine (stages 1, 2 and 3) over a runtime's tiers. Included by strata/strata.h, whose
 * conventions (status codes, strata_last_error(), handles) hold here; see docs/c_api.md.
 *
 *   strata_communicator_t* comm;            // RANK, WORLD_SIZE, ... (none: a job of one rank)
 *   strata_communicator_create_from_env(runtime, &comm);
 *   strata_zero_engine_create(runtime, comm, specs, n, &options, &engine);
 *   // per micro-step, per parameter, as backward produces its gradient:
 *   strata_zero_engine_acquire_grad(engine, p, STRATA_TIER_CPU, stream, &g);  // g += gradient
 *   strata_zero_engine_grad_ready(engine, p, stream);
 *   strata_zero_engine_step(engine, &result);
 */
#ifndef STRATA_STRATA_ZERO_H_
#define STRATA_STRATA_ZERO_H_

#include "strata/strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Communicator (data-parallel ranks) ------------------------------------------------------
 */

/* The ranks of a data-parallel job and the collectives between them (include/strata/comm/
 * communicator.h, docs/comm.md): Gloo for host buffers, NCCL for a CUDA runtime's buffers. It
 * belongs to the runtime whose device it uses, and is destroyed with it. */
typedef struct strata_communicator strata_communicator_t; /* opaque */

typedef int32_t strata_comm_backend_t;
enum { STRATA_COMM_BACKEND_GLOO = 1, STRATA_COMM_BACKEND_NCCL = 2 };

typedef int32_t strata_collective_t; /* indexes strata_comm_stats_t::by_kind */
enum {
  STRATA_COLLECTIVE_ALL_GATHER = 0,
  STRATA_COLLECTIVE_REDUCE_SCATTER = 1,
  STRATA_COLLECTIVE_ALL_REDUCE = 2,
  STRATA_COLLECTIVE_BROADCAST = 3,
  STRATA_COLLECTIVE_BARRIER = 4
};
#define STRATA_COLLECTIVE_COUNT 5

/* What this rank has issued, per kind. `bytes` is nccl-tests' size (all-gather: the gathered
 * output; reduce-scatter: the full input; all-reduce, broadcast: the buffer); `wire_bytes` what
 * this rank sends under a bandwidth-optimal algorithm. */
typedef struct strata_comm_kind_stats {
  uint64_t calls;
  uint64_t bytes;
  uint64_t wire_bytes;
} strata_comm_kind_stats_t;

typedef struct strata_comm_stats {
  strata_comm_kind_stats_t by_kind[STRATA_COLLECTIVE_COUNT]; /* by strata_collective_t */
  uint64_t total_bytes;
  uint64_t total_wire_bytes;
} strata_comm_stats_t;

/* Joins the job described by the launch variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
 * MASTER_PORT; none set: a job of one rank) and STRATA_COMM_* (backend, timeout, debug). Every
 * rank of the job must call it; it returns once all have (or fails after STRATA_COMM_TIMEOUT
 * naming the ranks that never came). Rank 0 serves the rendezvous on MASTER_PORT, a one-rank
 * job included, while the communicator lives. */
STRATA_API strata_status_t strata_communicator_create_from_env(strata_runtime_t* runtime,
                                                               strata_communicator_t** out);
/* Same, with `settings` overriding the environment: the five launch variables above and
 * STRATA_* names; a NULL value unsets one. */
STRATA_API strata_status_t strata_communicator_create(strata_runtime_t* runtime,
                                                      const strata_setting_t* settings,
                                                      size_t count, strata_communicator_t** out);
/* Drops the handle. A ZeRO engine using the communicator keeps it alive until the engine is
 * destroyed; the job is left (and MASTER_PORT freed) when the last user is gone. */
STRATA_API strata_status_t strata_communicator_destroy(strata_communicator_t* comm);
STRATA_API strata_status_t strata_communicator_rank(strata_communicator_t* comm, int32_t* out);
STRATA_API strata_status_t strata_communicator_size(strata_communicator_t* comm, int32_t* out);
STRATA_API strata_status_t strata_communicator_backend(strata_communicator_t* comm,
                                                       strata_comm_backend_t* out);
/* One line (backend, rank/size, rendezvous address, timeout), copied as
 * strata_runtime_describe() copies text. */
STRATA_API strata_status_t strata_communicator_describe(strata_communicator_t* comm, char* buffer,
                                                        size_t size, size_t* length);
STRATA_API strata_status_t strata_communicator_stats(strata_communicator_t* comm,
                                                     strata_comm_stats_t* out);
/* Returns once every rank of the job has called it (or with the communicator's error). */
STRATA_API strata_status_t strata_communicator_barrier(strata_communicator_t* comm);

/* ---- ZeRO-DP engine (stages 1, 2 and 3) -------------------------------------------------------
 */

/* Data-parallel training with ZeRO's partitioning (include/strata/zero/zero_engine.h): each
 * rank keeps the optimizer states of 1/N of the parameters (stage 1), and only the reduced
 * gradients of that slice too (stage 2), in the tiers of its offload optimizer options; the
 * parameters are flat tensors of the runtime, all-gathered after every step. At stage 3 each
 * rank holds only its shard of the parameters too (homed in any tier, NVMe included), and
 * strata_zero_engine_acquire_param() gathers a parameter's group for its use, ahead of need
 * along the order the first step recorded (or strata_zero_engine_set_fetch_order() gave).
 * Every rank creates it with the same parameters and options, and makes the same acquire,
 * release and gradient calls in the same order. Belongs to one runtime. */
typedef struct strata_zero_engine strata_zero_engine_t; /* opaque */

typedef struct strata_zero_param {
  uint32_t index;
} strata_zero_param_t;

typedef struct strata_zero_param_spec {
  const char* name;     /* unique */
  const int64_t* shape; /* `ndim` dimensions, each > 0 (NULL when ndim is 0: a scalar, which
                         * strata_zero_engine_param_info() reports as shape {1}) */
  size_t ndim;          /* <= STRATA_MAX_NDIM */
  uint32_t group;       /* hyper-parameter group: an index into options->groups */
  /* NULL (zeros), or the product of `shape` fp32 initial values (copied); every rank must pass
   * the same. */
  const float* initial;
} strata_zero_param_spec_t;

/* Fields are appended at the end as the engine grows: fill the struct with
 * strata_zero_options_init() before setting fields, so that a program written before a field
 * existed gets its default. */
typedef struct strata_zero_options {
  uint32_t stage; /* 1: optimizer states partitioned; 2: gradients too; 3: parameters too */
  strata_param_type_t param_type;
  strata_grad_type_t grad_type;
  /* The most gradient bytes of one flat group (one reduce-scatter); 32 MiB by default. */
  uint64_t bucket_bytes;
  uint32_t gradient_buckets; /* stage 2: buckets in use at once, >= 1 */
  uint32_t alignment;        /* every group is padded to a multiple of ranks x alignment */
  /* Stages 1-2: the flat parameter tensors, STRATA_TIER_GPU or _CPU. Stage 3: each rank's
   * parameter shards, any tier (STRATA_TIER_NVME: each rank reads only its own shard). */
  strata_tier_t param_home;
  uint32_t accumulation_steps; /* micro-steps per step */
  /* `group_count` hyper-parameter groups (NULL when 0: one, optimizer.defaults). */
  const strata_adam_group_t* groups;
  size_t group_count;
  /* Each rank's optimizer of its slice: state home, defaults, clipping, loss scaling. */
  strata_optimizer_options_t optimizer;
  /* Stage 3 (ignored at stages 1-2). Bytes are of param_type. */
  uint64_t persist_below_bytes; /* parameters smaller than this stay whole on every rank */
  uint64_t prefetch_bytes;      /* gathered bytes fetched ahead of the group in use */
  /* The most gathered bytes alive at once (in use, kept, ahead); 0 (the default): automatic,
   * 1 GiB or the largest gathered group, fitted to the GPU tier without a warning. */
  uint64_t max_live_bytes;
  uint64_t reuse_window_bytes; /* a released group stays gathered when the order uses it again
                                * within this many gathered bytes (0: always dropped) */
} strata_zero_options_t;

/* Where a parameter lives: `count` elements of param_type at byte `offset` in `tensor`. */
typedef struct strata_zero_view {
  strata_tensor_t tensor;
  uint64_t offset;
  uint64_t count;
} strata_zero_view_t;

typedef struct strata_zero_param_info {
  uint64_t count; /* elements */
  int32_t ndim;
  int64_t shape[STRATA_MAX_NDIM]; /* the first ndim entries; the rest 0 */
  uint32_t group;                 /* hyper-parameter group */
} strata_zero_param_info_t;

/* How the parameters were cut (include/strata/zero/zero_layout.h). */
typedef struct strata_zero_layout {
  uint32_t ranks;
  uint32_t alignment;
  uint32_t groups;          /* flat groups */
  uint64_t elements;        /* sum of the parameters' counts */
  uint64_t padded_elements; /* sum of the groups' padded sizes */
  uint64_t shard_elements;  /* what this rank's optimizer holds */
} strata_zero_layout_t;

/* Bytes of this rank's model states by tier (indexed by strata_tier_t), from the store's
 * record of the engine's tensors. */
typedef struct strata_zero_memory {
  uint64_t params[STRATA_TIER_COUNT];
  uint64_t grads[STRATA_TIER_COUNT];
  uint64_t optimizer_states[STRATA_TIER_COUNT];
  uint64_t buckets[STRATA_TIER_COUNT];
  uint64_t model_states; /* params + grads + optimizer states, all tiers */
  uint64_t gathered;     /* stage 3: gathered parameters alive now (not model states) */
} strata_zero_memory_t;

typedef struct strata_zero_stats {
  uint64_t steps;       /* step() calls that completed (skipped ones included) */
  uint64_t micro_steps; /* of the current step, completed by every group */
  uint64_t reduce_scatters;
  uint64_t all_gathers;
  uint64_t last_step_comm_bytes; /* communicator bytes (nccl-tests' size) of the last step */
  uint64_t last_step_ns;
  uint64_t last_step_wait_ns; /* of which waiting for reduce-scatters still running */
  uint64_t last_optimizer_ns; /* of which the optimizer (statistics all-reduce included) */
  uint64_t last_gather_ns;    /* of which the parameter all-gathers */
  /* Stage 3 fetching, since create: */
  uint64_t fetches;                /* uses of a group (its first parameter acquired) */
  uint64_t gathers_on_demand;      /* gathered at its use: not prefetched, not kept */
  uint64_t gathers_prefetched;     /* gathered ahead of its use */
  uint64_t prefetch_late;          /* used while its prefetched gather was still running */
  uint64_t reuses;                 /* used while still gathered from an earlier use */
  uint64_t gathers_dropped_unused; /* prefetched, then dropped (order changed, room needed) */
  uint64_t order_changes;          /* uses that departed from the recorded order */
  uint64_t gathered_bytes;         /* gathered parameter bytes alive now */
  uint64_t gathered_peak_bytes;
  uint64_t fetch_wait_ns; /* host time acquire_param spent fetching (the gathers themselves are
                           waited for on the stream: docs/zero.md) */
} strata_zero_stats_t;

/* The C++ defaults: stage 2, fp16 parameters and gradients, 32 MiB buckets, 2 buckets, alignment
 * 64, parameters homed on the GPU tier, one micro-step, strata_optimizer_options_init()'s; stage
 * 3: persistent below 128 KiB, 64 MiB prefetched, 1 GiB live, a 64 MiB reuse window. */
STRATA_API strata_status_t strata_zero_options_init(strata_zero_options_t* options);

/* Lays out the `count` parameters, creates their flat tensors in the runtime and this rank's
 * optimizer (initialised from each spec's `initial`). `options` may be NULL for the defaults.
 * `comm` must belong to `runtime`. */
STRATA_API strata_status_t strata_zero_engine_create(
    strata_runtime_t* runtime, strata_communicator_t* comm, const strata_zero_param_spec_t* params,
    size_t count, const strata_zero_options_t* options, strata_zero_engine_t** out);
STRATA_API strata_status_t strata_zero_engine_destroy(strata_zero_engine_t* engine);

STRATA_API strata_status_t strata_zero_engine_find(strata_zero_engine_t* engine, const char* name,
                                                   strata_zero_param_t* out);
STRATA_API strata_status_t strata_zero_engine_param_count(strata_zero_engine_t* engine,
                                                          uint32_t* out);
STRATA_API strata_status_t strata_zero_engine_param_info(strata_zero_engine_t* engine,
                                                         strata_zero_param_t param,
                                                         strata_zero_param_info_t* out);
/* The parameter's name, copied as strata_runtime_describe() copies text. */
STRATA_API strata_status_t strata_zero_engine_param_name(strata_zero_engine_t* engine,
                                                         strata_zero_param_t param, char* buffer,
                                                         size_t size, size_t* length);
STRATA_API strata_status_t strata_zero_engine_layout(strata_zero_engine_t* engine,
                                                     strata_zero_layout_t* out);

/* The model's copy of a parameter: a view into its group's flat tensor, or that tensor acquired
 * (as strata_tensor_acquire(), the offset added) until strata_zero_engine_release_param().
 * Stage 3: a partitioned parameter has no view (FAILED_PRECONDITION); acquire_param gathers its
 * group (a collective: every rank acquires the same parameters in the same order) and returns
 * the whole parameter, read-only (STRATA_ACCESS_WRITE is INVALID_ARGUMENT: the optimizer owns
 * its values; writes through the pointer are lost and may differ between ranks). Acquire once
 * and release once per use; release every parameter before step(). */
STRATA_API strata_status_t strata_zero_engine_param_view(strata_zero_engine_t* engine,
                                                         strata_zero_param_t param,
                                                         strata_zero_view_t* out);
STRATA_API strata_status_t strata_zero_engine_acquire_param(strata_zero_engine_t* engine,
                                                            strata_zero_param_t param,
                                                            strata_tier_t tier,
                                                            strata_stream_t* stream,
                                                            strata_access_mode_t mode, void** out);
STRATA_API strata_status_t strata_zero_engine_release_param(strata_zero_engine_t* engine,
                                                            strata_zero_param_t param,
                                                            strata_stream_t* stream);
/* Stage 3: the order in which the next steps use the parameters (`count` of them; repeats
 * allowed: forward, then backward), replacing the one the engine recorded; every rank gives the
 * same. Stages 1-2: FAILED_PRECONDITION. */
STRATA_API strata_status_t strata_zero_engine_set_fetch_order(strata_zero_engine_t* engine,
                                                              const strata_zero_param_t* order,
                                                              size_t count);

/* This micro-step's gradient buffer of the parameter in `tier` (its count elements of
 * grad_type): add (+=) the gradient into it, then strata_zero_engine_grad_ready(). Stage 2 may
 * wait here for a bucket to come back from its reduce-scatter. */
STRATA_API strata_status_t strata_zero_engine_acquire_grad(strata_zero_engine_t* engine,
                                                           strata_zero_param_t param,
                                                           strata_tier_t tier,
                                                           strata_stream_t* stream, void** out);
/* The gradient is complete once the work issued on `stream` so far is done; releases the
 * buffer. A group whose every parameter is ready is reduce-scattered at once. */
STRATA_API strata_status_t strata_zero_engine_grad_ready(strata_zero_engine_t* engine,
                                                         strata_zero_param_t param,
                                                         strata_stream_t* stream);
/* After accumulation_steps micro-steps: this rank's Adam step (clipping and overflow decided
 * over all ranks), then the parameters' all-gather (stage 3: the persistent ones only; the
 * gathered groups are dropped). No parameter may be acquired. `out` may be NULL. */
STRATA_API strata_status_t strata_zero_engine_step(strata_zero_engine_t* engine,
                                                   strata_step_result_t* out);
/* Drops the gradients of the micro-steps since the last step (every rank calls it). */
STRATA_API strata_status_t strata_zero_engine_zero_grad(strata_zero_engine_t* engine);
/* Changes hyper-parameter group `group` (an index into options->groups; 0 when there were none)
 * for the steps to come: a learning-rate schedule. Every rank calls it with the same values,
 * between step() and the next backward (with the overlapped step a later change is still exact:
 * step() redoes the early work). STRATA_NOT_FOUND: no such group. */
STRATA_API strata_status_t strata_zero_engine_set_group(strata_zero_engine_t* engine,
                                                        uint32_t group,
                                                        const strata_adam_group_t* hyper);
STRATA_API strata_status_t strata_zero_engine_get_group(strata_zero_engine_t* engine,
                                                        uint32_t group, strata_adam_group_t* out);

/* Collective checkpoints in `directory`, shared by the ranks: load() accepts one saved at any
 * world size, bucket size or alignment for the same parameters, and reshards it. */
STRATA_API strata_status_t strata_zero_engine_save(strata_zero_engine_t* engine,
                                                   const char* directory);
STRATA_API strata_status_t strata_zero_engine_load(strata_zero_engine_t* engine,
                                                   const char* directory);
/* Collective: the parameter's whole fp32 master and moments, gathered from the ranks that own
 * its pieces; each array holds `count` floats (the parameter's count) or is NULL to skip it. */
STRATA_API strata_status_t strata_zero_engine_read_state(strata_zero_engine_t* engine,
                                                         strata_zero_param_t param, float* master,
                                                         float* exp_avg, float* exp_avg_sq,
                                                         uint64_t count);
STRATA_API strata_status_t strata_zero_engine_memory(strata_zero_engine_t* engine,
                                                     strata_zero_memory_t* out);
STRATA_API strata_status_t strata_zero_engine_stats(strata_zero_engine_t* engine,
                                                    strata_zero_stats_t* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_STRATA_ZERO_H_ */
