// Communicator::split: sub-communicators, the way MPI_Comm_split and ncclCommSplit make them.
//
// The ranks agree on the groups through the parent's rendezvous (its TCP store), under keys
// that name the split: strata/split/<n>/member/<rank> = "<color> <key>", n counting this
// communicator's splits (the same on every rank that calls split in the same order). Each group
// then gets a rendezvous of its own, served by its rank 0 (a JobMonitor, with its watcher and
// post-mortem, so that a group's failure is reported as a job's is) and announced under
// strata/split/<n>/color/<color>, and the backend connects the group on it (Gloo: its pairs;
// NCCL: a unique id through it). Nothing of the parent's collectives is used, so a split takes
// no sequence number and a rank that never calls it cannot leave the parent out of step.
#include <absl/strings/numbers.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "communicator_base.h"
#include "job_monitor.h"
#include "strata/base/text.h"

namespace strata::comm_internal {

using text::cat;
using text::to_absl;

namespace {

struct Member {
  int color = 0;
  int key = 0;
  int rank = 0;  // in the parent
};

absl::StatusOr<Member> parse_member(std::string_view value, int rank) {
  const size_t space = value.find(' ');
  Member m{.rank = rank};
  if (space == std::string_view::npos ||
      !absl::SimpleAtoi(to_absl(value.substr(0, space)), &m.color) ||
      !absl::SimpleAtoi(to_absl(value.substr(space + 1)), &m.key)) {
    return absl::InternalError(to_absl(cat("rank ", rank, "'s split entry '", value,
                                           "' is not '<color> <key>': the rendezvous is shared "
                                           "with something that is not this job's strata")));
  }
  return m;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CommunicatorBase::create_split(
    const CommOptions&, std::unique_ptr<JobMonitor>, int, int) {
  return absl::UnimplementedError(
      to_absl(cat("Communicator::split: the ", engine(), " backend cannot split")));
}

absl::StatusOr<std::unique_ptr<Communicator>> CommunicatorBase::split(int color, int key) {
  if (color < 0) {
    return absl::InvalidArgumentError(to_absl(
        cat("Communicator::split: color ", color, " on rank ", rank(),
            " is negative: every rank joins a group, pass a color >= 0 (ranks of one color form "
            "one group)")));
  }
  if (health_->failing()) return broken_error();
  uint64_t n = 0;
  {
    MutexLock lock(&mutex_);
    n = ++splits_;
  }
  TcpStore& store = monitor_->store();
  const std::string prefix = cat("strata/split/", n, "/");
  const std::string what = cat("Communicator::split #", n, " (color ", color, ", key ", key,
                               ") on rank ", rank(), " of ", size());
  if (absl::Status s = store.set(cat(prefix, "member/", rank()), cat(color, " ", key)); !s.ok()) {
    return absl::Status(s.code(), to_absl(cat(what, ": ", s.message())));
  }
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(cat(prefix, "member/", r));
  if (absl::Status s = store.wait(keys, settings().timeout); !s.ok()) {
    // Name the ranks that never called this split (a rank that called it fewer times, or not at
    // all): their entries are missing.
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r) {
      absl::StatusOr<bool> present = store.check({keys[r]});
      if (present.ok() && !*present) missing.push_back(r);
    }
    if (missing.empty()) return absl::Status(s.code(), to_absl(cat(what, ": ", s.message())));
    return absl::DeadlineExceededError(to_absl(
        cat(what, ": rank(s) ", text::join(missing, ", "), " did not call split #", n,
            " within STRATA_COMM_TIMEOUT (", format_duration(settings().timeout),
            "): every rank of the communicator must call split, the same number of times and in "
            "the same order (",
            s.message(), ")")));
  }
  std::vector<Member> group;
  for (int r = 0; r < size(); ++r) {
    absl::StatusOr<std::string> value = store.get(keys[r]);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          to_absl(cat(what, ": ", value.status().message())));
    }
    absl::StatusOr<Member> m = parse_member(*value, r);
    if (!m.ok()) return m.status();
    if (m->color == color) group.push_back(*m);
  }
  std::sort(group.begin(), group.end(), [](const Member& a, const Member& b) {
    return std::tie(a.key, a.rank) < std::tie(b.key, b.rank);
  });
  const auto self =
      std::find_if(group.begin(), group.end(), [&](const Member& m) { return m.rank == rank(); });
  std::vector<int> parent_ranks;
  for (const Member& m : group) parent_ranks.push_back(m.rank);

  CommOptions sub = options_;
  sub.launch.rank = static_cast<int>(self - group.begin());
  sub.launch.world_size = static_cast<int>(group.size());
  // The group meets through the parent's store, never through the launcher's.
  sub.launch.agent_store = false;
  sub.launcher_store = nullptr;
  // Group rank 0 serves the group's rendezvous where the parent's peers reach it.
  const std::string announce = cat(prefix, "color/", color);
  std::unique_ptr<JobMonitor> monitor;
  if (sub.launch.rank == 0) {
    sub.launch.master_addr = store.local_address();
    sub.launch.master_port = 0;  // a free port, announced below
    absl::StatusOr<std::unique_ptr<JobMonitor>> joined = JobMonitor::join(sub.launch, settings());
    if (!joined.ok()) {
      return absl::Status(
          joined.status().code(),
          to_absl(cat(what, ": starting the group's rendezvous: ", joined.status().message())));
    }
    monitor = *std::move(joined);
    sub.launch.master_port = monitor->launch().master_port;
    if (absl::Status s =
            store.set(announce, cat(sub.launch.master_port, " ", sub.launch.master_addr));
        !s.ok()) {
      return absl::Status(s.code(), to_absl(cat(what, ": ", s.message())));
    }
  } else {
    absl::StatusOr<std::string> where = store.get(announce, settings().timeout);
    const size_t space = where.ok() ? where->find(' ') : std::string::npos;
    uint32_t port = 0;
    if (!where.ok() || space == std::string::npos ||
        !absl::SimpleAtoi(to_absl(std::string_view(*where).substr(0, space)), &port)) {
      return absl::UnavailableError(to_absl(cat(
          what, ": the group's rank 0 (rank ", parent_ranks.front(),
          ") did not announce the group's rendezvous: ",
          where.ok() ? cat("bad entry '", *where, "'") : std::string(where.status().message()))));
    }
    sub.launch.master_port = static_cast<uint16_t>(port);
    sub.launch.master_addr = where->substr(space + 1);
    absl::StatusOr<std::unique_ptr<JobMonitor>> joined = JobMonitor::join(sub.launch, settings());
    if (!joined.ok()) {
      return absl::Status(
          joined.status().code(),
          to_absl(cat(what, ": joining the group's rendezvous at ", sub.launch.master_addr, ":",
                      port, ": ", joined.status().message())));
    }
    monitor = *std::move(joined);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> made =
      create_split(sub, std::move(monitor), color, key);
  if (!made.ok()) {
    return absl::Status(made.status().code(), to_absl(cat(what, ": ", made.status().message())));
  }
  // Every backend's communicator is a CommunicatorBase; nobody else holds it yet.
  auto& base = static_cast<CommunicatorBase&>(**made);
  base.split_note_ = cat("[split #", n, " color ", color, " of a communicator of ", size(),
                         " ranks: its ranks 0..", group.size() - 1, " are that one's ranks ",
                         text::join(parent_ranks, ", "), "]");
  return made;
}

}  // namespace strata::comm_internal
