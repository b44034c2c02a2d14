// ActivationStash on the host backend (its "GPU" tier is host memory with the GPU arena's
// accounting): contents through every tier, the GPU window as the arena's high-water mark,
// prefetch along the recorded order, keep_tail, NVMe checksums, full tiers and misuse.
#include "strata/activations/activation_stash.h"

#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "strata/runtime/runtime.h"
#include "temp_dir.h"

namespace strata::testing {
namespace {

constexpr uint64_t kKiB = 1024;

struct StashRig {
  std::unique_ptr<TempDir> swap_dir;
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<Stream> stream;
  std::vector<TensorHandle> model;  // "model states" homed in the GPU tier
  uint64_t model_bytes = 0;

  explicit StashRig(bool nvme, const std::string& cpu_bytes = "32MiB",
                    const std::string& gpu_bytes = "4MiB") {
    std::map<std::string, std::string> vars = {{"STRATA_BACKEND", "host"},
                                               {"STRATA_GPU_BYTES", gpu_bytes},
                                               {"STRATA_CPU_BYTES", cpu_bytes}};
    if (nvme) {
      swap_dir = std::make_unique<TempDir>("strata-stash");
      vars.insert({{"STRATA_NVME_PATHS", swap_dir->path()},
                   {"STRATA_NVME_BYTES", "64MiB"},
                   {"STRATA_IO_BLOCK", "64KiB"},
                   {"STRATA_STAGING_BYTES", "4MiB"}});
    }
    auto config = Config::from_variables(vars);
    REQUIRE(config.ok());
    auto rt = Runtime::create(*config);
    REQUIRE(rt.ok());
    runtime = *std::move(rt);
    auto s = runtime->device().create_stream();
    REQUIRE(s.ok());
    stream = *std::move(s);
  }

  TensorStore& store() { return runtime->store(); }

  // Model states the trainer keeps in the GPU tier for the whole step.
  void add_model_states(uint64_t bytes) {
    auto t = store().create("model." + std::to_string(model.size()), bytes, TierKind::kGpu);
    REQUIRE(t.ok());
    model.push_back(*t);
    model_bytes += bytes;
  }

  std::unique_ptr<ActivationStash> stash(ActivationStashOptions options) {
    auto s = ActivationStash::create(store(), runtime->device(), std::move(options));
    REQUIRE(s.ok());
    return *std::move(s);
  }

  uint64_t gpu_peak() { return store().stats().tiers[0].peak_used; }
  void sync() { REQUIRE(runtime->device().synchronize(*stream).ok()); }
};

// Position-dependent bytes of activation `tag`.
void fill(void* data, uint64_t bytes, uint64_t tag) {
  auto* p = static_cast<uint32_t*>(data);
  for (uint64_t i = 0; i < bytes / 4; ++i) p[i] = static_cast<uint32_t>(tag * 2654435761U + i);
}
bool holds(const void* data, uint64_t bytes, uint64_t tag) {
  const auto* p = static_cast<const uint32_t*>(data);
  for (uint64_t i = 0; i < bytes / 4; ++i) {
    if (p[i] != static_cast<uint32_t>(tag * 2654435761U + i)) return false;
  }
  return true;
}

struct Saved {
  ActivationId id;
  uint64_t bytes;
  uint64_t tag;
};

// One forward: `sizes` activations, each written (GPU or CPU tier, drawn), then offloaded.
std::vector<Saved> forward(StashRig& rig, ActivationStash& stash,
                           const std::vector<uint64_t>& sizes, std::mt19937& rng, uint64_t& tag) {
  std::vector<Saved> saved;
  for (uint64_t bytes : sizes) {
    const TierKind tier = rng() % 3 == 0 ? TierKind::kCpu : TierKind::kGpu;
    auto buffer = stash.allocate(bytes, tier, *rig.stream);
    REQUIRE(buffer.ok());
    rig.sync();  // host code writes the memory (the host backend's "GPU" is host memory)
    fill(buffer->data, bytes, ++tag);
    REQUIRE(stash.offload(buffer->id, *rig.stream).ok());
    saved.push_back({buffer->id, bytes, tag});
  }
  return saved;
}

// One backward over `order` (indices into `saved`): load, check, free. `drain`: wait for each
// free to finish, so that what the window lets the stash prefetch does not depend on timing.
void backward(StashRig& rig, ActivationStash& stash, const std::vector<Saved>& saved,
              const std::vector<size_t>& order, bool drain = false) {
  for (size_t i : order) {
    auto data = stash.load(saved[i].id, *rig.stream);
    REQUIRE(data.ok());
    rig.sync();
    CHECK(holds(*data, saved[i].bytes, saved[i].tag));
    REQUIRE(stash.free(saved[i].id, *rig.stream).ok());
    if (drain) REQUIRE(stash.synchronize().ok());
  }
}

std::vector<uint64_t> draw_sizes(std::mt19937& rng, size_t n) {
  std::vector<uint64_t> sizes;
  // 4..48 KiB, most not a multiple of the arena's granularity (it rounds them up).
  for (size_t i = 0; i < n; ++i) sizes.push_back((1 + rng() % 12) * 4 * kKiB - 4 * (rng() % 64));
  return sizes;
}

std::vector<size_t> reversed(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.rbegin(), order.rend(), 0);
  return order;
}

}  // namespace

TEST_CASE(
    "ActivationStash: contents survive every tier, the GPU tier peaks at model states plus "
    "the window, and backward is prefetched",
    "[offload][activations]") {
  const bool nvme = GENERATE(false, true);
  const bool keep_tail = GENERATE(false, true);
  CAPTURE(nvme, keep_tail);
  StashRig rig(nvme);
  rig.add_model_states(128 * kKiB);
  ActivationStashOptions options;
  options.home = nvme ? TierKind::kNvme : TierKind::kCpu;
  options.window_bytes = 160 * kKiB;
  options.prefetch_bytes = 96 * kKiB;
  options.keep_tail = keep_tail;
  auto stash = rig.stash(options);
  std::mt19937 rng(7);
  uint64_t tag = 0;
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    rig.store().reset_peak_usage();
    stash->step_begin();
    // Variable sizes every step (sequence lengths): the order is keyed by save index.
    const auto saved = forward(rig, *stash, draw_sizes(rng, 24), rng, tag);
    uint64_t total = 0;
    for (const Saved& s : saved) total += s.bytes;
    REQUIRE(total > 3 * options.window_bytes);  // the window, not luck, bounds the peak
    backward(rig, *stash, saved, reversed(saved.size()), /*drain=*/true);
    REQUIRE(stash->synchronize().ok());
    CHECK(rig.gpu_peak() <= rig.model_bytes + options.window_bytes);
    const ActivationStashStats st = stash->stats();
    CHECK(st.gpu_peak_bytes <= options.window_bytes);
    CHECK(st.live == 0);
    CHECK(st.gpu_bytes == 0);
    CHECK(st.errors == 0);
  }
  const ActivationStashStats st = stash->stats();
  CHECK(st.loads == 4 * 24);
  CHECK(st.loads == st.loads_prefetched + st.loads_on_demand + st.loads_kept);
  CHECK(st.has_order);
  CHECK(st.order_changes == 0);  // the same reversed order every step
  CHECK(st.loads_prefetched > 24);
  if (keep_tail) {
    CHECK(st.kept > 0);
    CHECK(st.loads_kept == st.kept);
  } else {
    CHECK(st.kept == 0);
  }
  CHECK(st.saved == st.offloaded + st.kept);
  if (nvme) CHECK(rig.runtime->nvme()->stats().checksum_failures == 0);
}

TEST_CASE(
    "ActivationStash: backward in any order prefetches along the recorded one, a changed "
    "order is recorded again",
    "[offload][activations]") {
  StashRig rig(false);
  ActivationStashOptions options;
  options.window_bytes = 192 * kKiB;
  options.prefetch_bytes = 128 * kKiB;
  options.keep_tail = false;
  auto stash = rig.stash(options);
  std::mt19937 rng(11);
  std::vector<size_t> order = reversed(20);
  std::shuffle(order.begin(), order.end(), rng);
  uint64_t tag = 0;
  uint64_t on_demand_before = 0;
  for (int step = 0; step < 5; ++step) {
    CAPTURE(step);
    if (step == 3) std::shuffle(order.begin(), order.end(), rng);  // the model changed path
    stash->step_begin();
    const auto saved = forward(rig, *stash, draw_sizes(rng, 20), rng, tag);
    backward(rig, *stash, saved, order, /*drain=*/true);
    const ActivationStashStats st = stash->stats();
    if (step == 2) {
      // Steps 1 and 2 followed the order recorded in step 0: only each step's first load
      // found nothing ahead of it.
      CHECK(st.loads_on_demand - on_demand_before == 1);
    }
    on_demand_before = st.loads_on_demand;
  }
  stash->step_begin();
  const ActivationStashStats st = stash->stats();
  CHECK(st.order_changes == 1);
  CHECK(st.gpu_peak_bytes <= options.window_bytes);
}

TEST_CASE(
    "ActivationStash: keep_tail fetches backward's first activations back during forward "
    "when they were written to the CPU tier",
    "[offload][activations]") {
  StashRig rig(false);
  ActivationStashOptions options;
  options.window_bytes = 128 * kKiB;
  options.prefetch_bytes = 64 * kKiB;
  auto stash = rig.stash(options);
  uint64_t tag = 0;
  uint64_t on_demand_before = 0;
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    stash->step_begin();
    std::vector<Saved> saved;
    for (int i = 0; i < 16; ++i) {  // the torch hooks' path: copied into the CPU tier
      auto buffer = stash->allocate(16 * kKiB, TierKind::kCpu, *rig.stream);
      REQUIRE(buffer.ok());
      fill(buffer->data, 16 * kKiB, ++tag);
      REQUIRE(stash->offload(buffer->id, *rig.stream).ok());
      saved.push_back({buffer->id, 16 * kKiB, tag});
    }
    REQUIRE(stash->synchronize().ok());  // the tail's fetches are done before backward starts
    backward(rig, *stash, saved, reversed(saved.size()), /*drain=*/true);
    const ActivationStashStats st = stash->stats();
    // Step 0 knows no order: its first load is fetched on demand. Later steps find the first
    // loads (64 KiB: four activations) fetched during forward.
    CHECK(st.loads_on_demand - on_demand_before == (step == 0 ? 1 : 0));
    on_demand_before = st.loads_on_demand;
    CHECK(st.kept == 0);
  }
  CHECK(stash->stats().gpu_peak_bytes <= options.window_bytes);
}

TEST_CASE(
    "ActivationStash: backward on another thread, loads and frees interleaved with a "
    "concurrent forward",
    "[offload][activations]") {
  StashRig rig(GENERATE(false, true));
  ActivationStashOptions options;
  options.home = rig.runtime->nvme() != nullptr ? TierKind::kNvme : TierKind::kCpu;
  options.window_bytes = 256 * kKiB;
  options.prefetch_bytes = 64 * kKiB;
  auto stash = rig.stash(options);
  auto other = rig.runtime->device().create_stream();
  REQUIRE(other.ok());
  std::mt19937 rng(5);
  uint64_t tag = 0;
  std::vector<Saved> previous;
  for (int step = 0; step < 4; ++step) {
    stash->step_begin();
    // The previous step's backward runs on a second thread while this forward saves.
    std::atomic<bool> ok{true};
    std::thread back([&] {
      for (size_t i = previous.size(); i-- > 0;) {
        auto data = stash->load(previous[i].id, **other);
        if (!data.ok() || !rig.runtime->device().synchronize(**other).ok() ||
            !holds(*data, previous[i].bytes, previous[i].tag) ||
            !stash->free(previous[i].id, **other).ok()) {
          ok = false;
        }
      }
    });
    auto saved = forward(rig, *stash, draw_sizes(rng, 16), rng, tag);
    back.join();
    CHECK(ok.load());
    previous = std::move(saved);
  }
  backward(rig, *stash, previous, reversed(previous.size()));
  REQUIRE(stash->synchronize().ok());
  CHECK(stash->stats().live == 0);
  CHECK(stash->stats().gpu_peak_bytes <= options.window_bytes);
}

TEST_CASE("ActivationStash: a full CPU tier fails the save with the fix, and the stash goes on",
          "[offload][activations]") {
  StashRig rig(false, "1MiB");
  ActivationStashOptions options;
  options.window_bytes = 256 * kKiB;
  options.prefetch_bytes = 64 * kKiB;
  auto stash = rig.stash(options);
  stash->step_begin();
  std::vector<Saved> saved;
  absl::Status failure;
  uint64_t tag = 0;
  for (int i = 0; i < 64 && failure.ok(); ++i) {
    auto buffer = stash->allocate(64 * kKiB, TierKind::kGpu, *rig.stream);
    if (!buffer.ok()) {
      failure = buffer.status();
      break;
    }
    rig.sync();
    fill(buffer->data, 64 * kKiB, ++tag);
    REQUIRE(stash->offload(buffer->id, *rig.stream).ok());
    saved.push_back({buffer->id, 64 * kKiB, tag});
  }
  REQUIRE(absl::IsResourceExhausted(failure));
  CHECK_THAT(std::string(failure.message()),
             Catch::Contains("activation stash: saving activation") &&
                 Catch::Contains("STRATA_CPU_BYTES") && Catch::Contains("home nvme"));
  CHECK(stash->stats().gpu_bytes <= options.window_bytes);
  // Nothing saved before the failure is lost, and freeing makes room again.
  backward(rig, *stash, saved, reversed(saved.size()));
  REQUIRE(stash->synchronize().ok());
  auto again = stash->allocate(64 * kKiB, TierKind::kGpu, *rig.stream);
  REQUIRE(again.ok());
  REQUIRE(stash->free(again->id, *rig.stream).ok());
}

TEST_CASE(
    "ActivationStash: the next step's saves wait for the previous step's frees to give the CPU "
    "tier back, rather than failing",
    "[offload][activations]") {
  // A CPU tier one step fills (16 x 64 KiB), steps back to back with no synchronize(): the
  // previous backward's frees are destroyed by the mover in the background, so the next step's
  // first saves can find the tier still full of freed activations whose destroys are queued.
  // Before allocate() waited for them, some of these steps failed with "no room".
  StashRig rig(false, "1MiB");
  ActivationStashOptions options;
  options.window_bytes = 256 * kKiB;
  options.prefetch_bytes = 64 * kKiB;
  auto stash = rig.stash(options);
  uint64_t tag = 0;
  std::string failure;  // the first save that failed
  for (int step = 0; step < 60 && failure.empty(); ++step) {
    stash->step_begin();
    std::vector<Saved> saved;
    for (int i = 0; i < 16; ++i) {
      auto buffer = stash->allocate(64 * kKiB, TierKind::kCpu, *rig.stream);
      if (!buffer.ok()) {
        failure = "step " + std::to_string(step) + ", save " + std::to_string(i) + ": " +
                  std::string(buffer.status().message());
        break;
      }
      fill(buffer->data, 64 * kKiB, ++tag);
      REQUIRE(stash->offload(buffer->id, *rig.stream).ok());
      saved.push_back({buffer->id, 64 * kKiB, tag});
    }
    backward(rig, *stash, saved, reversed(saved.size()));
  }
  CHECK(failure == "");
  REQUIRE(stash->synchronize().ok());
  const ActivationStashStats st = stash->stats();
  CHECK(st.live == 0);
  CHECK(st.errors == 0);
  // A tier full of live activations is still an error, at once (nothing pending gives room).
  stash->step_begin();
  std::vector<Saved> live;
  for (int i = 0; i < 16; ++i) {
    auto buffer = stash->allocate(64 * kKiB, TierKind::kCpu, *rig.stream);
    REQUIRE(buffer.ok());
    fill(buffer->data, 64 * kKiB, ++tag);
    REQUIRE(stash->offload(buffer->id, *rig.stream).ok());
    live.push_back({buffer->id, 64 * kKiB, tag});
  }
  REQUIRE(stash->synchronize().ok());
  auto over = stash->allocate(64 * kKiB, TierKind::kCpu, *rig.stream);
  REQUIRE(absl::IsResourceExhausted(over.status()));
  CHECK_THAT(std::string(over.status().message()), Catch::Contains("STRATA_CPU_BYTES"));
  backward(rig, *stash, live, reversed(live.size()));
  REQUIRE(stash->synchronize().ok());
}

TEST_CASE("ActivationStash: a window the trainer fills is an error naming the window",
          "[offload][activations]") {
  StashRig rig(false);
  ActivationStashOptions options;
  options.window_bytes = 48 * kKiB;
  options.prefetch_bytes = 16 * kKiB;
  auto stash = rig.stash(options);
  auto too_large = stash->allocate(64 * kKiB, TierKind::kGpu, *rig.stream);
  REQUIRE(absl::IsResourceExhausted(too_large.status()));
  CHECK_THAT(std::string(too_large.status().message()),
             Catch::Contains("more than the whole GPU window"));
  auto first = stash->allocate(32 * kKiB, TierKind::kGpu, *rig.stream);
  REQUIRE(first.ok());
  // Not offloaded: the trainer holds it, so waiting cannot make room.
  auto second = stash->allocate(32 * kKiB, TierKind::kGpu, *rig.stream);
  REQUIRE(absl::IsResourceExhausted(second.status()));
  CHECK_THAT(std::string(second.status().message()),
             Catch::Contains("fill it") && Catch::Contains("32.00 KiB being written"));
  // CPU-tier saves do not touch the window.
  auto host = stash->allocate(32 * kKiB, TierKind::kCpu, *rig.stream);
  REQUIRE(host.ok());
  // The move home waits for the stream that wrote `first`, held here until the next allocate
  // is seen waiting for room: so it must wait, whatever the threads' timing.
  absl::Notification writer_done;
  REQUIRE(rig.runtime->device()
              .launch_host_callback(*rig.stream, [&] { writer_done.WaitForNotification(); })
              .ok());
  REQUIRE(stash->offload(first->id, *rig.stream).ok());
  CHECK(stash->stats().gpu_bytes == 32 * kKiB);  // still counted: its move cannot be done
  std::thread writer([&] {
    for (int i = 0; i < 60000 && stash->stats().room_waiters == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));  // bounded: a stash that never waits fails below
    }
    writer_done.Notify();
  });
  auto third = stash->allocate(32 * kKiB, TierKind::kGpu, *rig.stream);  // waits for the move
  writer.join();
  REQUIRE(third.ok());
  for (ActivationId id : {first->id, host->id, third->id}) {
    REQUIRE(stash->free(id, *rig.stream).ok());
  }
  REQUIRE(stash->synchronize().ok());
  CHECK(stash->stats().window_waits == 1);
  CHECK(stash->stats().room_waiters == 0);
  CHECK(stash->stats().live == 0);
}

TEST_CASE("ActivationStash: the window counts activations as the GPU tier rounds them",
          "[offload][activations]") {
  StashRig rig(false);
  const uint64_t granularity = rig.store().stats().tiers[0].granularity;
  REQUIRE(granularity >= 8);
  ActivationStashOptions options;
  options.window_bytes = 4 * granularity;
  options.prefetch_bytes = granularity;
  auto stash = rig.stash(options);
  const uint64_t used_before = rig.store().stats().tiers[0].used;
  // Four activations a little over half a granule each: their bytes fill half the window, the
  // blocks the arena gives them all of it.
  std::vector<ActivationStash::Buffer> held;
  for (int i = 0; i < 4; ++i) {
    auto buffer = stash->allocate(granularity / 2 + 4, TierKind::kGpu, *rig.stream);
    REQUIRE(buffer.ok());
    held.push_back(*buffer);
  }
  CHECK(stash->stats().gpu_bytes == options.window_bytes);
  CHECK(rig.store().stats().tiers[0].used - used_before == options.window_bytes);
  auto over = stash->allocate(4, TierKind::kGpu, *rig.stream);
  REQUIRE(absl::IsResourceExhausted(over.status()));
  CHECK_THAT(std::string(over.status().message()), Catch::Contains("fill it"));
  for (const auto& buffer : held) REQUIRE(stash->free(buffer.id, *rig.stream).ok());
  REQUIRE(stash->synchronize().ok());
  CHECK(stash->stats().gpu_bytes == 0);
  CHECK(stash->stats().gpu_peak_bytes == options.window_bytes);
}

TEST_CASE("ActivationStash: a flipped byte on NVMe fails the load with DataLoss",
          "[offload][activations][nvme]") {
  StashRig rig(true);
  ActivationStashOptions options;
  options.home = TierKind::kNvme;
  options.window_bytes = 256 * kKiB;
  options.prefetch_bytes = 0;  // each load reads the drive itself
  auto stash = rig.stash(options);
  stash->step_begin();
  std::mt19937 rng(3);
  uint64_t tag = 0;
  const auto saved = forward(rig, *stash, std::vector<uint64_t>(6, 64 * kKiB), rng, tag);
  REQUIRE(stash->synchronize().ok());  // every activation is on the drive now
  // Flip one byte in every 4 KiB of the swap file's first MiB, through a second descriptor.
  int corrupted = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (error || target.rfind(rig.swap_dir->path() + "/", 0) != 0) continue;
    const int fd = open(entry.path().c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    for (off_t at = 100; at < (1 << 20); at += 4096) {
      unsigned char byte = 0;
      if (pread(fd, &byte, 1, at) != 1) break;
      byte ^= 0x20;
      REQUIRE(pwrite(fd, &byte, 1, at) == 1);
    }
    REQUIRE(fsync(fd) == 0);
    close(fd);
    ++corrupted;
  }
  REQUIRE(corrupted == 1);
  auto data = stash->load(saved.back().id, *rig.stream);
  REQUIRE(absl::IsDataLoss(data.status()));
  CHECK_THAT(std::string(data.status().message()),
             Catch::Contains("checksum mismatch") && Catch::Contains("activation."));
  for (const Saved& s : saved) REQUIRE(stash->free(s.id, *rig.stream).ok());
  REQUIRE(stash->synchronize().ok());
}

TEST_CASE("ActivationStash: options and misuse get clear errors", "[offload][activations]") {
  StashRig rig(false);
  ActivationStashOptions bad;
  bad.prefetch_bytes = bad.window_bytes + 1;
  auto made = ActivationStash::create(rig.store(), rig.runtime->device(), bad);
  CHECK(absl::IsInvalidArgument(made.status()));
  CHECK_THAT(std::string(made.status().message()), Catch::Contains("prefetch_bytes"));
  bad = {};
  bad.home = TierKind::kGpu;
  CHECK(absl::IsInvalidArgument(
      ActivationStash::create(rig.store(), rig.runtime->device(), bad).status()));
  bad = {};
  bad.home = TierKind::kNvme;
  made = ActivationStash::create(rig.store(), rig.runtime->device(), bad);
  CHECK(absl::IsFailedPrecondition(made.status()));
  CHECK_THAT(std::string(made.status().message()), Catch::Contains("STRATA_NVME_PATHS"));

  ActivationStashOptions options;
  options.window_bytes = 256 * kKiB;
  options.prefetch_bytes = 64 * kKiB;
  auto stash = rig.stash(options);
  auto buffer = stash->allocate(8 * kKiB, TierKind::kGpu, *rig.stream);
  REQUIRE(buffer.ok());
  CHECK(absl::IsFailedPrecondition(stash->load(buffer->id, *rig.stream).status()));
  CHECK(absl::IsFailedPrecondition(stash->unload(buffer->id, *rig.stream)));
  REQUIRE(stash->offload(buffer->id, *rig.stream).ok());
  CHECK(absl::IsFailedPrecondition(stash->offload(buffer->id, *rig.stream)));
  REQUIRE(stash->free(buffer->id, *rig.stream).ok());
  CHECK(absl::IsFailedPrecondition(stash->free(buffer->id, *rig.stream)));
  CHECK(absl::IsFailedPrecondition(stash->load(buffer->id, *rig.stream).status()));
  CHECK(absl::IsInvalidArgument(stash->allocate(0, TierKind::kGpu, *rig.stream).status()));
  CHECK(absl::IsFailedPrecondition(stash->write_trace("/tmp/unused.trace")));
  // An aborted forward: allocated, never offloaded, freed.
  auto aborted = stash->allocate(8 * kKiB, TierKind::kGpu, *rig.stream);
  REQUIRE(aborted.ok());
  REQUIRE(stash->free(aborted->id, *rig.stream).ok());
  REQUIRE(stash->synchronize().ok());
  CHECK(stash->stats().live == 0);
  CHECK(rig.store().stats().tensors == 0);
}

TEST_CASE("ActivationStash: the recorded trace is the window's occupancy",
          "[offload][activations]") {
  StashRig rig(false);
  TempDir dir;
  ActivationStashOptions options;
  options.window_bytes = 128 * kKiB;
  options.prefetch_bytes = 64 * kKiB;
  options.record_trace = true;
  auto stash = rig.stash(options);
  std::mt19937 rng(9);
  uint64_t tag = 0;
  for (int step = 0; step < 3; ++step) {
    stash->step_begin();
    const auto saved = forward(rig, *stash, draw_sizes(rng, 12), rng, tag);
    backward(rig, *stash, saved, reversed(saved.size()));
  }
  REQUIRE(stash->synchronize().ok());
  const std::string path = dir.path() + "/stash.trace";
  REQUIRE(stash->write_trace(path).ok());
  std::ifstream in(path);
  std::map<std::string, uint64_t> live;
  uint64_t bytes = 0, peak = 0, allocations = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string op, name;
    fields >> op >> name;
    if (op == "a") {
      uint64_t size = 0;
      fields >> size;
      REQUIRE(live.emplace(name, size).second);
      bytes += size;
      peak = std::max(peak, bytes);
      ++allocations;
    } else {
      REQUIRE(op == "f");
      REQUIRE(live.count(name) == 1);
      bytes -= live[name];
      live.erase(name);
    }
  }
  CHECK(live.empty());
  CHECK(allocations >= 36);
  CHECK(peak == stash->stats().gpu_peak_bytes);
  CHECK(peak <= options.window_bytes);
}

}  // namespace strata::testing
