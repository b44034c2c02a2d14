// The job around a communicator: the rendezvous (rank 0 serves the TCP store, every rank
// connects), a watcher that notices when another rank fails, and the post-mortem that turns a
// local failure into one message naming the operation, its sequence number and the rank(s) at
// fault. Backend-neutral: Gloo and NCCL communicators both own one.
//
// Store keys: strata/abort (set by the first rank that fails), strata/state/<rank> (what each
// rank had issued when it learned of the failure), strata/waiting/<rank> (the peers a failing
// rank's timed-out send or receive waited on), strata/host/<rank>, strata/left (ranks that left
// cleanly).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "collective_call.h"
#include "strata/base/mutex.h"
#include "strata/comm/launch.h"
#include "strata/comm/launcher_store.h"
#include "strata/comm/tcp_store.h"
#include "strata/config/comm_settings.h"

namespace strata::comm_internal {

class JobMonitor {
 public:
  // Rank 0 starts the server; every rank connects (waiting up to the timeout for the others).
  // With a launcher's store (a job of several ranks), rank 0 serves on a free port and
  // announces it there instead of binding MASTER_PORT (rendezvous_address.h); `launcher` is
  // used only during the call.
  static absl::StatusOr<std::unique_ptr<JobMonitor>> join(const LaunchInfo& launch,
                                                          const CommSettings& settings,
                                                          LauncherStore* launcher = nullptr);
  // Leaves cleanly: every rank marks itself left; rank 0 keeps serving until every other rank
  // has left or is lost (bounded by the timeout), so that no rank mistakes a normal exit of
  // rank 0, or its exit after another rank's failure, for rank 0's own failure.
  ~JobMonitor();

  TcpStore& store() { return *store_; }
  const LaunchInfo& launch() const { return launch_; }
  const CommSettings& settings() const { return settings_; }

  // What this rank has issued (read by the watcher when another rank fails).
  void issued(const CollectiveCall& call);

  // A collective failed on this rank with `local` (the engine's words): tells the other ranks,
  // gathers what they had issued (a bounded wait), and returns the error for the user. A rank
  // that died, then ranks that did not answer, are at fault; when every rank answered, a Gloo
  // send or receive that timed out (gloo_peers.h) is pinned on the peer it waited on, followed
  // through peers that timed out in turn, where that leads to other hosts; otherwise the ranks
  // out of step are.
  absl::Status post_mortem(const CollectiveCall& call, std::string_view local);

 private:
  JobMonitor(LaunchInfo launch, CommSettings settings);
  // Rank 0: serves on a free port of the interface towards MASTER_ADDR and announces it in
  // `launcher`; the others read it. Sets launch_'s master_addr and master_port to that point.
  absl::Status meet_through(LauncherStore& launcher);
  void watch();
  void post_state();

  LaunchInfo launch_;
  CommSettings settings_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  std::unique_ptr<TcpStore> store_;
  std::unique_ptr<TcpStore> watcher_store_;
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
  absl::Mutex mutex_;
  std::string last_issued_ ABSL_GUARDED_BY(mutex_);  // "<sequence>\t<describe()>"
  bool state_posted_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace strata::comm_internal
