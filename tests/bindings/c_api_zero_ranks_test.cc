// Every rank of a strata-run job (CTest: c_api.zero_ranks_2, `strata-run -n 2`) trains the same
// tiny model through the C API at ZeRO stages 1, 2 and 3 (stage 3 with the parameter shards in
// the CPU tier and again on NVMe), each rank with gradients of its own, and
// checks that its parameters and optimizer states are bitwise those of a one-rank engine (a job
// of its own, in the same process) fed the ranks' averaged gradients in the order the stage
// reduces them. Every rank checking against the same one-rank run is the ranks agreeing. Then
// a checkpoint saved by the job loads into the one-rank engine (resharding from 2 ranks to 1).
// At stage 3 every read of a parameter gathers it from the ranks' shards (a collective).
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "c_api_fixtures.h"
#include "c_api_zero_fixtures.h"
#include "skip.h"
#include "strata/strata.h"
#include "temp_dir.h"

namespace strata::testing {
namespace {

// Rank r's target for parameter p at step s: the gradient of 0.5·|w − t|² is w − t.
std::vector<float> gradient_of(const std::vector<float>& w, int rank, size_t p, size_t step,
                               size_t micro) {
  std::vector<float> g(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const float target =
        std::sin(static_cast<float>(1 + 3 * rank + 5 * p + 7 * step + 11 * micro + i));
    g[i] = w[i] - target;
  }
  return g;
}

void add_to(std::vector<float>& sum, const std::vector<float>& g) {
  for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
}

struct Side {
  strata_zero_engine_t* engine = nullptr;
  strata_stream_t* stream = nullptr;
};

TEST_CASE("c_api: ZeRO over the ranks of a job matches one rank, bitwise", "[c_api][zero]") {
  const char* world = std::getenv("WORLD_SIZE");
  if (world == nullptr) {
    strata::testing::skip("run under strata-run -n 2 (CTest: c_api.zero_ranks_2)");
    return;
  }
  // The job, and a one-rank job of its own (on another port) for the reference.
  TempDir swap("strata-c-zero-ranks-nvme");
  Vars job_vars = nvme_vars(swap.path());
  job_vars.emplace_back("STRATA_CPU_BYTES", "16MiB");
  TestRuntime job_rt(job_vars);
  TestRuntime ref_rt(Vars{{"STRATA_CPU_BYTES", "16MiB"}});
  strata_communicator_t* comm = nullptr;
  strata_communicator_t* solo = nullptr;
  REQUIRE_OK(strata_communicator_create_from_env(job_rt.runtime, &comm));
  REQUIRE_OK(make_solo_comm(ref_rt.runtime, &solo));
  int32_t rank = 0;
  int32_t ranks = 0;
  REQUIRE_OK(strata_communicator_rank(comm, &rank));
  REQUIRE_OK(strata_communicator_size(comm, &ranks));
  REQUIRE(ranks == std::atoi(world));
  REQUIRE(ranks >= 2);
  Side job;
  Side ref;
  REQUIRE_OK(strata_stream_create(job_rt.runtime, &job.stream));
  REQUIRE_OK(strata_stream_create(ref_rt.runtime, &ref.stream));
  const TinyModel model;
  const auto specs = model.specs();
  const size_t n_params = specs.size();
  // Rank 0's port: the same directory name on every rank.
  const std::string checkpoint =
      (std::filesystem::temp_directory_path() /
       ("strata-c-zero-ranks-" + std::string(std::getenv("MASTER_PORT"))))
          .string();

  const std::pair<uint32_t, strata_tier_t> rounds[] = {
      {1U, STRATA_TIER_CPU}, {2U, STRATA_TIER_CPU}, {3U, STRATA_TIER_CPU}, {3U, STRATA_TIER_NVME}};
  for (const auto& [stage, home] : rounds) {
    const uint32_t micro_steps = 2;
    INFO("rank " << rank << " of " << ranks << ", stage " << stage << ", param_home " << home);
    strata_zero_options_t options = tiny_options(stage);
    options.accumulation_steps = micro_steps;
    options.param_home = home;
    REQUIRE_OK(strata_zero_engine_create(job_rt.runtime, comm, specs.data(), n_params, &options,
                                         &job.engine));
    options.accumulation_steps = 1;  // the reference gets each step's reduced gradient at once
    options.param_home = STRATA_TIER_CPU;
    REQUIRE_OK(strata_zero_engine_create(ref_rt.runtime, solo, specs.data(), n_params, &options,
                                         &ref.engine));
    for (size_t step = 1; step <= 4; ++step) {
      std::vector<std::vector<float>> ref_grads;
      for (size_t p = 0; p < n_params; ++p) {
        const size_t count = model.count(p);
        const strata_zero_param_t id{static_cast<uint32_t>(p)};
        const auto w = read_param(job.engine, id, job.stream, count);
        REQUIRE(same_bits(w, read_param(ref.engine, id, ref.stream, count)));
        // What the job's reduction computes, before its division by the rank count (exact):
        // stage 1 reduces each rank's sum over the micro-steps; stages 2-3 sum the reductions.
        std::vector<float> sum(count, 0.0F);
        if (stage == 1) {
          for (int r = 0; r < ranks; ++r) {
            std::vector<float> local(count, 0.0F);
            for (size_t m = 0; m < micro_steps; ++m) add_to(local, gradient_of(w, r, p, step, m));
            add_to(sum, local);
          }
        } else {
          for (size_t m = 0; m < micro_steps; ++m) {
            std::vector<float> reduced(count, 0.0F);
            for (int r = 0; r < ranks; ++r) add_to(reduced, gradient_of(w, r, p, step, m));
            add_to(sum, reduced);
          }
        }
        for (float& x : sum) x /= static_cast<float>(ranks);
        ref_grads.push_back(std::move(sum));
      }
      for (size_t m = 0; m < micro_steps; ++m) {
        for (size_t p = 0; p < n_params; ++p) {
          const strata_zero_param_t id{static_cast<uint32_t>(p)};
          const auto w = read_param(job.engine, id, job.stream, model.count(p));
          add_grad(job.engine, id, job.stream, gradient_of(w, rank, p, step, m));
        }
      }
      for (size_t p = 0; p < n_params; ++p) {
        add_grad(ref.engine, strata_zero_param_t{static_cast<uint32_t>(p)}, ref.stream,
                 ref_grads[p]);
      }
      strata_step_result_t got{};
      strata_step_result_t want{};
      REQUIRE_OK(strata_zero_engine_step(job.engine, &got));
      REQUIRE_OK(strata_zero_engine_step(ref.engine, &want));
      CHECK(got.step == step);
      CHECK(got.skipped == 0);
      CHECK(got.grad_norm == Approx(want.grad_norm).epsilon(1e-5));
      for (size_t p = 0; p < n_params; ++p) {
        const size_t count = model.count(p);
        const strata_zero_param_t id{static_cast<uint32_t>(p)};
        std::vector<float> m(count), v(count), v2(count), rm(count), rv(count), rv2(count);
        REQUIRE_OK(
            strata_zero_engine_read_state(job.engine, id, m.data(), v.data(), v2.data(), count));
        REQUIRE_OK(
            strata_zero_engine_read_state(ref.engine, id, rm.data(), rv.data(), rv2.data(), count));
        CHECK(same_bits(m, rm));
        CHECK(same_bits(v, rv));
        CHECK(same_bits(v2, rv2));
        CHECK(same_bits(read_param(job.engine, id, job.stream, count), m));
      }
    }
    strata_zero_layout_t layout;
    REQUIRE_OK(strata_zero_engine_layout(job.engine, &layout));
    CHECK(layout.ranks == static_cast<uint32_t>(ranks));
    CHECK(layout.shard_elements * static_cast<uint64_t>(ranks) == layout.padded_elements);
    strata_zero_memory_t memory;
    REQUIRE_OK(strata_zero_engine_memory(job.engine, &memory));
    CHECK(memory.optimizer_states[STRATA_TIER_CPU] >= 12 * layout.shard_elements);
    CHECK(memory.optimizer_states[STRATA_TIER_CPU] < 12 * layout.padded_elements);
    strata_zero_stats_t stats;
    REQUIRE_OK(strata_zero_engine_stats(job.engine, &stats));
    CHECK(stats.steps == 4);
    CHECK(stats.last_step_comm_bytes > 0);
    if (stage == 3) {
      // Each rank holds half of the partitioned parameters: less than the reference's whole.
      strata_zero_memory_t ref_memory;
      REQUIRE_OK(strata_zero_engine_memory(ref.engine, &ref_memory));
      CHECK(memory.params[home] > 0);
      uint64_t mine = 0;
      uint64_t whole = 0;
      for (int t = 0; t < STRATA_TIER_COUNT; ++t) {
        mine += memory.params[t];
        whole += ref_memory.params[t];
      }
      CHECK(mine < whole);
      CHECK(stats.fetches > 0);
      CHECK(stats.gathers_on_demand + stats.gathers_prefetched > 0);
      CHECK(stats.gathered_peak_bytes > 0);
      // max_live_bytes 0: automatic, 1 GiB here (the groups are small) bounded by the tier.
      CHECK(stats.gathered_peak_bytes <=
            (options.max_live_bytes != 0 ? options.max_live_bytes : 1ULL << 30));
    } else {
      CHECK(stats.fetches == 0);
    }

    // Saved by the ranks, loaded by one rank: the reference (retrained a step further) gets
    // the job's state back.
    REQUIRE_OK(strata_zero_engine_save(job.engine, checkpoint.c_str()));
    for (uint32_t p = 0; p < n_params; ++p) {
      add_grad(ref.engine, strata_zero_param_t{p}, ref.stream,
               std::vector<float>(model.count(p), 1.0F));
    }
    REQUIRE_OK(strata_zero_engine_step(ref.engine, nullptr));
    REQUIRE_OK(strata_zero_engine_load(ref.engine, checkpoint.c_str()));
    for (uint32_t p = 0; p < n_params; ++p) {
      const size_t count = model.count(p);
      const strata_zero_param_t id{p};
      std::vector<float> m(count), rm(count);
      REQUIRE_OK(strata_zero_engine_read_state(job.engine, id, m.data(), nullptr, nullptr, count));
      REQUIRE_OK(strata_zero_engine_read_state(ref.engine, id, rm.data(), nullptr, nullptr, count));
      CHECK(same_bits(m, rm));
      CHECK(same_bits(read_param(ref.engine, id, ref.stream, count), m));
    }
    REQUIRE_OK(strata_communicator_barrier(comm));  // every rank has read the checkpoint
    if (rank == 0) std::filesystem::remove_all(checkpoint);
    REQUIRE_OK(strata_zero_engine_destroy(job.engine));
    REQUIRE_OK(strata_zero_engine_destroy(ref.engine));
  }
  strata_comm_stats_t stats;
  REQUIRE_OK(strata_communicator_stats(comm, &stats));
  CHECK(stats.by_kind[STRATA_COLLECTIVE_REDUCE_SCATTER].calls > 0);
  CHECK(stats.by_kind[STRATA_COLLECTIVE_ALL_GATHER].calls > 0);
  CHECK(stats.by_kind[STRATA_COLLECTIVE_BARRIER].calls == 4);
}

}  // namespace
}  // namespace strata::testing
