// How ZeroEngine's collectives are ordered, without the trainer's thread waiting for them:
//
//   - Issue: on buffers acquired on a stream. NCCL runs on the stream; Gloo's worker first waits
//     for the work queued on it (an event the communicator records at issue), so inputs copied
//     there have landed before Gloo reads them.
//   - Completion: NCCL's is on the stream. A Gloo collective completes on the host, so later
//     work on the stream waits for a host flag (Device::wait_host_flag) that the completer
//     thread raises once the collective is done — in issue order, which is Gloo's order.
//   - Bounce: Gloo moves host memory. On a CUDA device the data crosses through a pinned buffer
//     per stream: a D2H copy into it before the collective and an H2D copy out after it, both on
//     the stream. Every use of a bounce buffer is ordered on its one stream (the reduce-scatter's
//     also after the reducer has read the previous result, a host flag too), so one buffer per
//     stream serves every collective in turn.
//
// Where the host still waits is listed in docs/zero.md ("Where the trainer's thread waits").
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "strata/base/log.h"
#include "strata/base/mutex.h"
#include "strata/config/config.h"
#include "strata/testing/zero_testing.h"
#include "zero_engine_impl.h"

namespace strata {
namespace {

std::atomic<bool> bounce_for_testing{false};

}  // namespace

namespace testing {
void set_zero_bounce_for_testing(bool on) { bounce_for_testing = on; }
}  // namespace testing

absl::Status ZeroEngine::Impl::start_collectives() {
  Device& device = runtime.device();
  gloo = comm.backend() != CommBackendKind::kNccl;
  bounce = gloo && (device.backend() != Backend::kHost || bounce_for_testing.load());
  for (auto* stream : {&comm_stream, &gather_stream, &land_stream, &host_stream}) {
    auto created = device.create_stream();
    if (!created.ok()) return created.status();
    *stream = *std::move(created);
  }
  if (!bounce) return absl::OkStatus();
  uint64_t largest = 0;
  for (const ZeroFlatGroup& fg : layout.groups()) largest = std::max(largest, fg.padded);
  auto gathers = device.allocate_pinned(largest * param_bytes,
                                        "ZeroEngine's bounce buffer for Gloo's all-gathers");
  if (!gathers.ok()) return gathers.status();
  gather_bounce = *std::move(gathers);
  auto reduces = device.allocate_pinned(largest * grad_bytes,
                                        "ZeroEngine's bounce buffer for Gloo's reduce-scatters");
  if (!reduces.ok()) return reduces.status();
  reduce_bounce = *std::move(reduces);
  if (options.stage >= 2) {  // the buckets are reset from these on the device
    auto zero_bytes = device.allocate_pinned(largest * grad_bytes, "ZeroEngine's bucket zeros");
    if (!zero_bytes.ok()) return zero_bytes.status();
    zeros = *std::move(zero_bytes);
    std::memset(zeros->data(), 0, zeros->size());
  }
  return absl::OkStatus();
}

void ZeroEngine::Impl::stop_collectives() {
  {
    MutexLock lock(&completion_mu);
    completer_stopping = true;
    completion_changed.SignalAll();
  }
  if (completer.joinable()) completer.join();
}

void ZeroEngine::Impl::run_completer() {
  for (;;) {
    Completion c;
    {
      MutexLock lock(&completion_mu);
      while (completions.empty() && !completer_stopping) wait(&completion_changed, &completion_mu);
      if (completions.empty()) return;  // stopping, and every flag raised
      c = std::move(completions.front());
      completions.pop_front();
    }
    // Bounded by the communicator's timeout. A failure is the engine's; the flag goes up all
    // the same (the data is then not to be trusted, and the engine refuses further work).
    if (absl::Status st = c.work->wait(); !st.ok()) (void)fail(st);
    if (c.done != nullptr) c.done->store(true, std::memory_order_release);
    (void)runtime.device().raise_host_flag(*c.flag);
  }
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> ZeroEngine::Impl::issue(
    Stream& stream, const CollectiveCall& call) {
  if (!gloo || comm_waits_streams.load()) {
    auto work = call(CollectiveOptions{.stream = &stream});
    if (work.ok() || !gloo || !absl::IsInvalidArgument(work.status())) return work;
    // Gloo refused the stream before issuing anything: the communicator has no device, or
    // another one than this runtime's. If the call goes through without the stream, that was
    // it: the host waits for the stream from now on.
    if (auto st = runtime.device().synchronize(stream); !st.ok()) return st;
    auto retried = call(CollectiveOptions{});
    if (!retried.ok()) return retried;  // the arguments were wrong: the first error stands
    comm_waits_streams = false;
    log::warn_once(
        "ZeroEngine: the Gloo communicator cannot wait on this runtime's streams (it was created "
        "without the runtime's device), so the host waits for each collective's inputs; create "
        "it with Communicator::from_environment(&runtime->device())");
    return retried;
  }
  if (auto st = runtime.device().synchronize(stream); !st.ok()) return st;
  return call(CollectiveOptions{});
}

absl::Status ZeroEngine::Impl::order_after(std::unique_ptr<CollectiveWork> work, Stream& stream,
                                           std::shared_ptr<std::atomic<bool>> done) {
  if (!gloo) return work->wait();  // NCCL ran on `stream`: returns once ordered there
  auto made = runtime.device().create_host_flag();
  if (!made.ok()) {
    (void)work->wait();  // nothing can be ordered after it: it must be over before any user
    return made.status();
  }
  std::shared_ptr<HostFlag> flag = *std::move(made);
  {
    MutexLock lock(&completion_mu);
    completions.push_back(Completion{std::move(work), flag, std::move(done)});
    completion_changed.SignalAll();
  }
  // After the hand-over: where the device has no stream wait, this waits on the host for the
  // completer.
  return runtime.device().wait_host_flag(stream, *flag);
}

absl::Status ZeroEngine::Impl::gather(const void* send, void* recv, uint64_t count,
                                      std::shared_ptr<std::atomic<bool>> done) {
  return gather_on(comm, rank, send, recv, count, std::move(done));
}

absl::Status ZeroEngine::Impl::gather_on(Communicator& c, uint32_t c_rank, const void* send,
                                         void* recv, uint64_t count,
                                         std::shared_ptr<std::atomic<bool>> done) {
  Device& device = runtime.device();
  Stream& stream = *gather_stream;
  const DataType type = comm_type(options.param_type);
  if (!bounce) {
    auto work = issue(stream, [&](const CollectiveOptions& co) {
      return c.all_gather(send, recv, count, type, co);
    });
    if (!work.ok()) return work.status();
    return order_after(*std::move(work), stream, std::move(done));
  }
  const uint64_t slice = count * param_bytes;
  auto* all = static_cast<std::byte*>(gather_bounce->data());
  std::byte* own = all + static_cast<uint64_t>(c_rank) * slice;
  if (auto st = device.copy_async(own, send, slice, CopyKind::kDeviceToHost, stream); !st.ok()) {
    return st;
  }
  auto work = issue(
      stream, [&](const CollectiveOptions& co) { return c.all_gather(own, all, count, type, co); });
  if (!work.ok()) return work.status();
  if (auto st = order_after(*std::move(work), stream, std::move(done)); !st.ok()) return st;
  return device.copy_async(recv, all, static_cast<uint64_t>(c.size()) * slice,
                           CopyKind::kHostToDevice, stream);
}

absl::Status ZeroEngine::Impl::start_hpz() {
  const uint32_t l = options.hpz_node_ranks;
  if (l == 0) return absl::OkStatus();
  if (options.stage != 3) {
    log::warn_once(absl::StrFormat(
        "ZeroEngine: hpz_node_ranks = %d is ignored at stage %d: hpZ partitions stage 3's "
        "parameter gathers (stages 1-2 gather each group once per step, after the optimizer)",
        l, options.stage));
    return absl::OkStatus();
  }
  if (ranks % l != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ZeroEngine: hpz_node_ranks = %d does not divide the job's %d ranks; give the ranks per "
        "node (LOCAL_WORLD_SIZE), the same on every node, or 0 for no hpZ",
        l, ranks));
  }
  if (l >= ranks) {
    STRATA_LOG(kInfo,
               "ZeroEngine: hpZ is off: all %d ranks are on one node (hpz_node_ranks = %d), so no "
               "gather crosses nodes",
               ranks, l);
    return absl::OkStatus();
  }
  // Nodes of l consecutive ranks; a node's ranks in the job's order (its slices in group order).
  auto node = comm.split(static_cast<int>(rank / l), static_cast<int>(rank));
  if (!node.ok()) {
    return absl::Status(
        node.status().code(),
        absl::StrCat("ZeroEngine: hpZ: the node's communicator: ", node.status().message()));
  }
  node_comm = *std::move(node);
  node_rank = static_cast<uint32_t>(node_comm->rank());
  node_ranks = static_cast<uint32_t>(node_comm->size());
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> hpz_node_ranks_from_environment() {
  const char* value = std::getenv("STRATA_ZERO_HPZ");
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "0" || v == "off" || v == "false") return 0;
  if (v != "1" && v != "on" && v != "true") {
    return absl::InvalidArgumentError(
        absl::StrCat("STRATA_ZERO_HPZ='", v,
                     "' is not a switch: use 1 (on: nodes of LOCAL_WORLD_SIZE ranks) "
                     "or 0 (off)"));
  }
  absl::StatusOr<Config> config = Config::from_environment();
  if (!config.ok()) return config.status();
  if (!config->local.world_size.has_value()) {
    return absl::InvalidArgumentError(
        "STRATA_ZERO_HPZ=1 needs LOCAL_WORLD_SIZE, the ranks per node (torchrun and strata-run set "
        "it): set it, or STRATA_ZERO_HPZ=0");
  }
  return static_cast<uint32_t>(*config->local.world_size);
}

}  // namespace strata
