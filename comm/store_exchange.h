// Every rank posts a small record under `<prefix><rank>` in the rendezvous store and reads every
// rank's: an all-gather through the store, for what all ranks must decide alike before any
// collective engine exists (the `auto` backend, the ranks sharing a GPU), and the wording of
// the ranks it finds at fault.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/base/text.h"
#include "strata/comm/tcp_store.h"

namespace strata::comm_internal {

// "rank 3", "ranks 0 and 1", "ranks 1, 2 and 5": the ranks an exchange found at fault.
inline std::string name_ranks(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return text::cat("rank ", ranks[0]);
  std::string out = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += text::cat(ranks[i]);
  }
  return out;
}

// Record has `std::string encode() const` and `static absl::StatusOr<Record> decode(string)`.
// `what` says what the exchange was for, in the error when a rank does not post in time
// ("rank 1 of 4: <what>: <the store's message>").
template <typename Record>
absl::StatusOr<std::vector<Record>> exchange_records(TcpStore& store, std::string_view prefix,
                                                     int rank, int world_size, const Record& mine,
                                                     std::string_view what) {
  const std::string who = text::cat("rank ", rank, " of ", world_size);
  if (absl::Status s = store.set(text::cat(prefix, rank), mine.encode()); !s.ok()) return s;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(text::cat(prefix, r));
  if (absl::Status s = store.wait(keys, store.options().timeout); !s.ok()) {
    return absl::Status(s.code(), text::to_absl(text::cat(who, ": ", what, ": ", s.message())));
  }
  std::vector<Record> all;
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<std::string> value = store.get(keys[r]);
    if (!value.ok()) return value.status();
    absl::StatusOr<Record> record = Record::decode(*value);
    if (!record.ok()) {
      return absl::InvalidArgumentError(
          text::to_absl(text::cat(who, ": rank ", r, " posted ", record.status().message())));
    }
    all.push_back(*std::move(record));
  }
  return all;
}

}  // namespace strata::comm_internal
