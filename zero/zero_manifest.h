// The manifest of a ZeRO checkpoint: what load() needs to rebuild the writer's layout (world
// size, group size, alignment, the parameters) and to trust its files (a checksum per rank and
// group), plus the optimizer's counters and hyper-parameters. Text, floats as hex: bitwise.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/optimizer/offload_optimizer.h"
#include "strata/zero/zero_layout.h"

namespace strata {

struct ZeroManifest {
  uint32_t ranks = 1;
  uint64_t group_elements = 0;
  uint32_t alignment = 1;
  uint32_t stage = 2;
  uint64_t step = 0;
  float loss_scale = 1.0F;
  uint64_t good_steps = 0;
  uint64_t shard_steps = 0;  // Adam steps every slice has taken (its bias correction)
  uint64_t nonce = 0;        // names this checkpoint's rank files
  std::vector<AdamGroup> groups;
  std::vector<ZeroLayoutParam> params;
  std::vector<std::vector<uint64_t>> checksums;  // [rank][group] of each record

  // "zero-<nonce>-rank<r>.state"
  std::string rank_file(uint32_t rank) const;
};

constexpr const char* kZeroManifestName = "zero.manifest";

std::string render(const ZeroManifest& m);
// DataLoss naming the path and line when the text is not a manifest.
absl::StatusOr<ZeroManifest> parse_zero_manifest(const std::string& text, const std::string& path);
// The file at `path`, parsed; NotFound naming it when it is absent.
absl::StatusOr<ZeroManifest> read_zero_manifest(const std::string& path);

}  // namespace strata
