// One rank of a job that goes wrong on purpose, for comm_failure_test. Usage:
//   comm_fault_rank SCENARIO FAULTY_RANK
// Scenarios: ok (no fault), die (FAULTY_RANK is killed while its all_reduce is in flight),
// other-op (it issues a broadcast where the others all_reduce), other-size (its all_reduce
// has another size), fewer (it stops issuing collectives and sleeps, as if stuck), freeze (it
// stops whole, watcher thread included, with SIGSTOP: silent, like a machine whose link is gone),
// split-fewer (it calls Communicator::split once where the others call it twice), split-die (it is
// killed inside its split group's all_reduce), claim-nccl
// (it claims a GPU and NCCL for STRATA_COMM_BACKEND=auto: STRATA_TESTING_CLAIM_NCCL).
//   comm_fault_rank shared-gpu SHARING
// Every rank claims the same simulated GPU (strata/testing/simulated_gpu.h) on a host device
// whose arena assumed SHARING ranks on it, and passes a barrier.
// Prints "rank R: ok" or "rank R: error: <message>" on stderr and exits 0 or 1.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/device/backend.h"
#include "strata/testing/simulated_gpu.h"

namespace {

int report(int rank, const absl::Status& status) {
  if (status.ok()) {
    std::fprintf(stderr, "rank %d: ok\n", rank);
    return 0;
  }
  std::fprintf(stderr, "rank %d: error: %s\n", rank, std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(
        stderr,
        "usage: comm_fault_rank "
        "ok|die|other-op|other-size|fewer|freeze|split-fewer|split-die|claim-nccl FAULTY_RANK\n"
        "       comm_fault_rank shared-gpu SHARING\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const int faulty = std::atoi(argv[2]);
  if (scenario == "shared-gpu") {
    absl::StatusOr<std::unique_ptr<strata::Device>> device =
        strata::make_device(strata::Backend::kHost, 0);
    if (!device.ok()) return report(-1, device.status());
    (*device)->set_budget_sharing(faulty);
    strata::testing::simulate_gpu_for_testing(
        strata::testing::SimulatedGpu{.pci_bus_id = "0000:3b:00.0", .ordinal = 0});
    auto comm = strata::Communicator::from_environment(device->get());
    if (!comm.ok()) return report(-1, comm.status());
    auto joined = (*comm)->barrier();
    if (!joined.ok()) return report((*comm)->rank(), joined.status());
    return report((*comm)->rank(), (*joined)->wait());
  }
  if (scenario == "claim-nccl" && std::getenv("RANK") != nullptr &&
      std::atoi(std::getenv("RANK")) == faulty) {
    setenv("STRATA_TESTING_CLAIM_NCCL", "1", 1);
  }
  absl::StatusOr<std::unique_ptr<strata::Communicator>> created =
      strata::Communicator::from_environment();
  if (!created.ok()) return report(-1, created.status());
  strata::Communicator& comm = **created;
  const int rank = comm.rank();
  const bool me = rank == faulty;
  constexpr uint64_t kCount = 4 << 20;  // 16 MiB of float32: long enough to be killed inside
  std::vector<float> data(kCount, 1.0f);
  if (scenario == "split-fewer" || scenario == "split-die") {
    // Groups of two consecutive ranks. split-fewer: FAULTY_RANK calls split once, the others
    // twice. split-die: FAULTY_RANK is killed inside its group's all_reduce.
    auto group = comm.split(rank / 2, rank);
    if (!group.ok()) return report(rank, group.status());
    if (scenario == "split-fewer") {
      // A barrier in the group first: Gloo connects a group's pairs lazily on both sides, and a
      // faulty rank that left right after split #1 could close its socket while its peer still
      // connected (under load the peer then failed in split #1, not #2).
      auto joined = (*group)->barrier();
      if (!joined.ok()) return report(rank, joined.status());
      if (absl::Status s = (*joined)->wait(); !s.ok()) return report(rank, s);
      if (me) return report(rank, absl::OkStatus());
      auto again = comm.split(0, rank);
      return report(rank, again.status());
    }
    // The faulty rank dies inside the group's second all_reduce; its peer fails in that one or
    // a later one (if its part of the second was done before the kill landed).
    for (int step = 0; step < 4; ++step) {
      auto work = (*group)->all_reduce(data.data(), data.data(), kCount, strata::DataType::kFloat32,
                                       strata::ReduceOp::kSum);
      if (!work.ok()) return report(rank, work.status());
      if (me && step == 1) {
        usleep(20000);
        raise(SIGKILL);
      }
      if (absl::Status s = (*work)->wait(); !s.ok()) return report(rank, s);
    }
    return report(rank, absl::OkStatus());
  }
  for (int step = 0; step < 6; ++step) {
    if (step == 3 && me && scenario == "fewer") {
      sleep(600);  // stuck outside strata; the test kills it
      return 3;
    }
    if (step == 3 && me && scenario == "freeze") {
      raise(SIGSTOP);  // the test kills it
      return 3;
    }
    absl::StatusOr<std::unique_ptr<strata::CollectiveWork>> work;
    if (step == 3 && me && scenario == "other-op") {
      work = comm.broadcast(data.data(), kCount, strata::DataType::kFloat32, 0);
    } else if (step == 3 && me && scenario == "other-size") {
      work = comm.all_reduce(data.data(), data.data(), kCount / 2, strata::DataType::kFloat32,
                             strata::ReduceOp::kSum);
    } else {
      work = comm.all_reduce(data.data(), data.data(), kCount, strata::DataType::kFloat32,
                             strata::ReduceOp::kAverage);
    }
    if (!work.ok()) return report(rank, work.status());
    if (step == 3 && me && scenario == "die") {
      usleep(20000);  // let the engine start moving bytes
      raise(SIGKILL);
    }
    if (absl::Status s = (*work)->wait(); !s.ok()) return report(rank, s);
  }
  return report(rank, absl::OkStatus());
}
