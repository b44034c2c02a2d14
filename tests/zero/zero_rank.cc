// One rank of a ZeRO job for the tests that need several jobs in a row: the resharding chain
// (zero_reshard.cmake: save at 4 ranks, load at 2, 3, 1 and 4, resume) and the failure scenario
// (zero_test.cc: a rank killed mid-step, then the last checkpoint loaded by a new job).
//
//   zero_rank train-save OUT STEPS          train STEPS steps from the start, save to OUT
//   zero_rank load-check-save IN OUT        load IN, compare with IN/expected.bin, save to OUT
//   zero_rank load-check IN                 load IN, compare with IN/expected.bin
//   zero_rank resume-compare IN FROM MORE REF
//                                           load IN, train steps FROM..FROM+MORE-1, compare with
//                                           REF/expected.bin
//   zero_rank save-then-train OUT MORE      train 2 steps, save to OUT, then train MORE steps
//                                           (the multi-node faults strike during those)
//   zero_rank fault OUT                     train 2 steps, save to OUT; in step 3 the last rank
//                                           kills itself halfway through its gradients (stage 3:
//                                           halfway through the forward's gathers)
//
// ZERO_RANK_STATES=nvme puts the optimizer states on NVMe (a temporary directory per process).
// ZERO_RANK_STAGE=1|2|3 picks the stage (default 2); at stage 3 each step starts with a forward
// that acquires and releases every parameter (gathers), and the shards live in the CPU tier.
//
// Every save also writes expected.bin (rank 0): every parameter's master and moments, gathered
// — what any later load must reproduce bit for bit. Exit status 0, or 1 with a message.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/zero/zero_engine.h"
#include "zero/zero_rig.h"

namespace strata {
namespace {

// ZERO_RANK_STATES=nvme: the optimizer states live on NVMe, in a directory of this process's own.
struct NvmeDir {
  std::string path;
  ~NvmeDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

struct Job {
  NvmeDir nvme;
  std::unique_ptr<Runtime> runtime;  // outlives the communicator, which uses its device
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<ZeroEngine> engine;
  testing::ZeroModel model = testing::zero_model();
};

absl::Status start(Job& job) {
  const char* states = std::getenv("ZERO_RANK_STATES");
  const bool nvme = states != nullptr && std::string(states) == "nvme";
  if (nvme) {
    std::string pattern = (std::filesystem::temp_directory_path() / "zero-rank-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    job.nvme.path = pattern;
  }
  auto runtime = testing::zero_runtime(job.nvme.path);
  if (!runtime.ok()) return runtime.status();
  job.runtime = *std::move(runtime);
  // With the runtime's device: Gloo waits on the engine's streams.
  auto comm = Communicator::from_environment(&job.runtime->device());
  if (!comm.ok()) return comm.status();
  job.comm = *std::move(comm);
  auto stream = job.runtime->device().create_stream();
  if (!stream.ok()) return stream.status();
  job.stream = *std::move(stream);
  ZeroOptions o;
  o.stage = 2;
  if (const char* stage = std::getenv("ZERO_RANK_STAGE"); stage != nullptr) {
    o.stage = static_cast<uint32_t>(std::atoi(stage));
  }
  if (o.stage == 3) {
    o.param_home = TierKind::kCpu;
    o.persist_below_bytes = 128;  // the norms and the bias stay whole
    o.prefetch_bytes = 8 << 10;
  }
  // Each world size gets its own layout too: groups and padding differ from the writer's.
  o.bucket_bytes = (5 + 2 * static_cast<uint64_t>(job.comm->size())) << 10;
  o.alignment = job.comm->size() % 2 == 0 ? 8 : 4;
  o.groups = {AdamGroup{.lr = 1e-2F, .weight_decay = 0.01F}, AdamGroup{.lr = 3e-3F, .beta1 = 0.8F}};
  o.optimizer.loss_scaling = {.scale = 1024.0F, .dynamic = true, .growth_interval = 2};
  o.optimizer.max_grad_norm = 50.0F;
  if (nvme) o.optimizer.state_home = TierKind::kNvme;
  auto engine = ZeroEngine::create(*job.runtime, *job.comm, job.model.params, o);
  if (!engine.ok()) return engine.status();
  job.engine = *std::move(engine);
  return absl::OkStatus();
}

// Stage 3's forward: every parameter acquired (gathered) and released, in order; the last rank
// of a dying step kills itself after `die_after` of them.
absl::Status forward(Job& job, int die_after = -1) {
  for (uint32_t p = 0; p < job.model.params.size(); ++p) {
    if (static_cast<int>(p) == die_after) {
      std::fflush(nullptr);
      raise(SIGKILL);
    }
    auto got = job.engine->acquire_param(ZeroParamId{p}, TierKind::kGpu, *job.stream);
    if (!got.ok()) return got.status();
    if (auto st = job.engine->release_param(ZeroParamId{p}, *job.stream); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status train(Job& job, uint64_t from, uint64_t steps, int die_in_step = -1) {
  const uint32_t rank = static_cast<uint32_t>(job.comm->rank());
  const bool dies = rank == static_cast<uint32_t>(job.comm->size() - 1);
  const bool stage3 = job.engine->options().stage == 3;
  for (uint64_t step = from; step < from + steps; ++step) {
    if (stage3) {
      const bool dying = static_cast<int>(step) == die_in_step && dies;
      if (auto st = forward(job, dying ? 3 : -1); !st.ok()) return st;
    }
    if (static_cast<int>(step) == die_in_step && dies) {
      // Halfway through backward: some groups' reduce-scatters are issued, others are not.
      for (uint32_t p = static_cast<uint32_t>(job.model.params.size()) - 1; p >= 4; --p) {
        auto g = job.engine->acquire_grad(ZeroParamId{p}, TierKind::kGpu, *job.stream);
        if (!g.ok()) return g.status();
        if (auto st = job.engine->grad_ready(ZeroParamId{p}, *job.stream); !st.ok()) return st;
      }
      std::fflush(nullptr);
      raise(SIGKILL);
    }
    if (auto st = testing::zero_micro_step(*job.engine, *job.stream, job.model,
                                           job.engine->options().grad_type, step, 0, rank, false);
        !st.ok()) {
      return st;
    }
    auto result = job.engine->step();
    if (!result.ok()) return result.status();
  }
  return absl::OkStatus();
}

// Every parameter's master and moments, gathered, and the optimizer's counters.
absl::StatusOr<std::vector<float>> dump(Job& job) {
  std::vector<float> out;
  for (uint32_t p = 0; p < job.model.params.size(); ++p) {
    const size_t n = job.model.initial[p].size();
    std::vector<float> master(n), m(n), v(n);
    if (auto st = job.engine->read_state(ZeroParamId{p}, master, m, v); !st.ok()) return st;
    out.insert(out.end(), master.begin(), master.end());
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), v.begin(), v.end());
    // The model's copy is the master rounded.
    auto param = testing::zero_param(*job.engine, *job.stream, p);
    if (!param.ok()) return param.status();
    for (size_t i = 0; i < n; ++i) {
      const float rounded = testing::load_value(
          std::vector<uint16_t>{adam_detail::float_to_half(master[i])}.data(), GradType::kF16, 0);
      if ((*param)[i] != rounded) {
        return absl::InternalError(
            absl::StrFormat("parameter %s[%d] is %g, its master %g rounds to %g",
                            job.model.params[p].name, i, (*param)[i], master[i], rounded));
      }
    }
  }
  const OffloadOptimizer::ScalerState s = job.engine->optimizer().scaler_state();
  out.push_back(static_cast<float>(s.step));
  out.push_back(s.loss_scale);
  out.push_back(static_cast<float>(s.good_steps));
  return out;
}

absl::Status save(Job& job, const std::string& dir) {
  if (auto st = job.engine->save(dir); !st.ok()) return st;
  auto state = dump(job);
  if (!state.ok()) return state.status();
  if (job.comm->rank() == 0) {
    std::ofstream out(dir + "/expected.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(state->data()),
              static_cast<std::streamsize>(state->size() * sizeof(float)));
    if (!out) return absl::UnavailableError("cannot write " + dir + "/expected.bin");
  }
  return absl::OkStatus();
}

absl::Status compare(Job& job, const std::string& dir) {
  auto state = dump(job);
  if (!state.ok()) return state.status();
  std::ifstream in(dir + "/expected.bin", std::ios::binary);
  std::vector<float> expected(state->size());
  in.read(reinterpret_cast<char*>(expected.data()),
          static_cast<std::streamsize>(expected.size() * sizeof(float)));
  if (!in || in.peek() != EOF) {
    return absl::DataLossError(dir + "/expected.bin does not hold this model's states");
  }
  uint64_t differ = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(&expected[i], &(*state)[i], sizeof(float)) != 0) ++differ;
  }
  if (differ > 0) {
    return absl::InternalError(
        absl::StrFormat("%d of %d values differ from %s/expected.bin (not bitwise equal)", differ,
                        expected.size(), dir));
  }
  return absl::OkStatus();
}

absl::Status run(const std::vector<std::string>& args) {
  auto usage = absl::InvalidArgumentError("usage: see the comment at the top of zero_rank.cc");
  if (args.empty()) return usage;
  Job job;
  if (auto st = start(job); !st.ok()) return st;
  const std::string& what = args[0];
  if (what == "train-save" && args.size() == 3) {
    if (auto st = train(job, 0, std::stoull(args[2])); !st.ok()) return st;
    return save(job, args[1]);
  }
  if ((what == "load-check-save" && args.size() == 3) ||
      (what == "load-check" && args.size() == 2)) {
    if (auto st = job.engine->load(args[1]); !st.ok()) return st;
    if (auto st = compare(job, args[1]); !st.ok()) return st;
    return what == "load-check" ? absl::OkStatus() : save(job, args[2]);
  }
  if (what == "resume-compare" && args.size() == 5) {
    if (auto st = job.engine->load(args[1]); !st.ok()) return st;
    if (auto st = train(job, std::stoull(args[2]), std::stoull(args[3])); !st.ok()) return st;
    return compare(job, args[4]);
  }
  if (what == "save-then-train" && args.size() == 3) {
    if (auto st = train(job, 0, 2); !st.ok()) return st;
    if (auto st = save(job, args[1]); !st.ok()) return st;
    return train(job, 2, std::stoull(args[2]));
  }
  if (what == "fault" && args.size() == 2) {
    if (auto st = train(job, 0, 2); !st.ok()) return st;
    if (auto st = save(job, args[1]); !st.ok()) return st;
    return train(job, 2, 2, /*die_in_step=*/2);
  }
  return usage;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  const absl::Status st = strata::run(std::vector<std::string>(argv + 1, argv + argc));
  if (!st.ok()) {
    std::fprintf(stderr, "zero_rank: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("zero_rank: ok\n");
  return 0;
}
