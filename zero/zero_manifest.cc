#include "zero_manifest.h"

#include <absl/strings/str_format.h>

#include <cstdint>

#include "strata/optimizer/checkpoint_manifest.h"

namespace strata {
namespace {

constexpr ManifestFormat kFormat{.name = "strata-zero-checkpoint",
                                 .version = 1,
                                 .what = "ZeRO checkpoint",
                                 .writer = "ZeroEngine::save()",
                                 .end_line = true};

}  // namespace

std::string ZeroManifest::rank_file(uint32_t rank) const {
  return absl::StrFormat("zero-%016x-rank%d.state", nonce, rank);
}

std::string render(const ZeroManifest& m) {
  ManifestWriter out(kFormat);
  out.add("world", m.ranks, m.group_elements, m.alignment, m.stage);
  out.add("step", m.step, m.loss_scale, m.good_steps, m.shard_steps);
  out.add("nonce", ManifestHex{m.nonce});
  for (const AdamGroup& g : m.groups) add_adam_group(out, "adam", g);
  for (const ZeroLayoutParam& p : m.params) {
    out.add("param", p.adam_group, p.shape.size(), p.shape, p.name);  // the name may hold spaces
  }
  // Stage 3's persistent parameters (by index): they are packed apart, so the layout needs them.
  std::vector<int64_t> persistent;
  for (size_t i = 0; i < m.params.size(); ++i) {
    if (m.params[i].persistent) persistent.push_back(static_cast<int64_t>(i));
  }
  if (!persistent.empty()) out.add("persistent", persistent);
  for (uint32_t r = 0; r < m.checksums.size(); ++r) {
    for (uint32_t g = 0; g < m.checksums[r].size(); ++g) {
      out.add("checksum", r, g, ManifestHex{m.checksums[r][g]});
    }
  }
  return std::move(out).finish();
}

absl::StatusOr<ZeroManifest> parse_zero_manifest(const std::string& text, const std::string& path) {
  using Count = ManifestReader::Count;
  constexpr size_t kAny = SIZE_MAX;
  ZeroManifest m;
  bool world = false;
  std::vector<size_t> persistent;
  ManifestReader reader(kFormat, path);
  reader.on("world", 4, 4, Count::kRequired, [&](const ManifestLine& l) {
    world = l.get(0, &m.ranks) && l.get(1, &m.group_elements) && l.get(2, &m.alignment) &&
            l.get(3, &m.stage) && m.ranks > 0 && m.alignment > 0;
    m.checksums.assign(world ? m.ranks : 0, {});
    return world;
  });
  reader.on("step", 4, 4, Count::kOptional, [&](const ManifestLine& l) {
    return l.get(0, &m.step) && l.get(1, &m.loss_scale) && l.get(2, &m.good_steps) &&
           l.get(3, &m.shard_steps);
  });
  reader.on("nonce", 1, 1, Count::kOptional, [&](const ManifestLine& l) {
    ManifestHex nonce;
    if (!l.get(0, &nonce)) return false;
    m.nonce = nonce.value;
    return true;
  });
  read_adam_groups(reader, "adam", &m.groups);
  // param <adam group> <dims> <extent>... <name>
  reader.on("param", 3, kAny, Count::kRepeated, [&](const ManifestLine& l) {
    ZeroLayoutParam p;
    size_t dims = 0;
    if (!l.get(0, &p.adam_group) || !l.get(1, &dims) || dims > l.size() - 3) return false;
    p.count = 1;
    for (size_t d = 0; d < dims; ++d) {
      int64_t extent = 0;
      if (!l.get(2 + d, &extent) || extent <= 0) return false;
      p.shape.push_back(extent);
      p.count *= static_cast<uint64_t>(extent);
    }
    if (!l.rest(2 + dims, &p.name)) return false;
    m.params.push_back(std::move(p));
    return true;
  });
  reader.on("persistent", 1, kAny, Count::kOptional, [&](const ManifestLine& l) {
    for (size_t i = 0; i < l.size(); ++i) {
      size_t index = 0;
      if (!l.get(i, &index)) return false;
      persistent.push_back(index);
    }
    return true;
  });
  reader.on("checksum", 3, 3, Count::kRepeated, [&](const ManifestLine& l) {
    uint32_t rank = 0;
    uint32_t group = 0;
    ManifestHex sum;
    if (!world || !l.get(0, &rank) || !l.get(1, &group) || !l.get(2, &sum) || rank >= m.ranks ||
        group != m.checksums[rank].size()) {
      return false;
    }
    m.checksums[rank].push_back(sum.value);
    return true;
  });
  if (auto st = reader.read(text); !st.ok()) return st;
  for (size_t index : persistent) {
    if (index >= m.params.size()) {
      return reader.error(reader.last_line(),
                          absl::StrFormat("persistent parameter %d of %d", index, m.params.size()));
    }
    m.params[index].persistent = true;
  }
  return m;
}

absl::StatusOr<ZeroManifest> read_zero_manifest(const std::string& path) {
  auto text = read_manifest_file(kFormat, path);
  if (!text.ok()) return text.status();
  return parse_zero_manifest(*text, path);
}

}  // namespace strata
