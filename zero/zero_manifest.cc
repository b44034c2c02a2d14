#include "zero_manifest.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>

#include "strata/optimizer/checkpoint_io.h"

namespace strata {
namespace {

constexpr const char* kMagic = "strata-zero-checkpoint 1";

}  // namespace

std::string ZeroManifest::rank_file(uint32_t rank) const {
  return absl::StrFormat("zero-%016x-rank%d.state", nonce, rank);
}

std::string render(const ZeroManifest& m) {
  std::string out = absl::StrCat(kMagic, "\n");
  absl::StrAppend(&out, "world ", m.ranks, " ", m.group_elements, " ", m.alignment, " ", m.stage,
                  "\n");
  absl::StrAppend(&out, "step ", m.step, " ", hex(m.loss_scale), " ", m.good_steps, " ",
                  m.shard_steps, "\n");
  absl::StrAppend(&out, "nonce ", absl::StrFormat("%016x", m.nonce), "\n");
  for (const AdamGroup& g : m.groups) {
    absl::StrAppend(&out, "adam ", hex(g.lr), " ", hex(g.beta1), " ", hex(g.beta2), " ", hex(g.eps),
                    " ", hex(g.weight_decay), " ", g.decoupled ? 1 : 0, "\n");
  }
  for (const ZeroLayoutParam& p : m.params) {
    absl::StrAppend(&out, "param ", p.adam_group, " ", p.shape.size());
    for (int64_t d : p.shape) absl::StrAppend(&out, " ", d);
    absl::StrAppend(&out, " ", p.name, "\n");  // the name last: it may contain spaces
  }
  // Stage 3's persistent parameters (by index): they are packed apart, so the layout needs them.
  std::string persistent;
  for (size_t i = 0; i < m.params.size(); ++i) {
    if (m.params[i].persistent) absl::StrAppend(&persistent, " ", i);
  }
  if (!persistent.empty()) absl::StrAppend(&out, "persistent", persistent, "\n");
  for (uint32_t r = 0; r < m.checksums.size(); ++r) {
    for (uint32_t g = 0; g < m.checksums[r].size(); ++g) {
      absl::StrAppend(&out, "checksum ", r, " ", g, " ",
                      absl::StrFormat("%016x", m.checksums[r][g]), "\n");
    }
  }
  absl::StrAppend(&out, "end\n");
  return out;
}

absl::StatusOr<ZeroManifest> parse_zero_manifest(const std::string& text, const std::string& path) {
  auto bad = [&](int line, absl::string_view why) {
    return absl::DataLossError(absl::StrFormat(
        "ZeRO checkpoint: %s line %d: %s; the checkpoint is damaged or not one written by "
        "ZeroEngine::save()",
        path, line, why));
  };
  ZeroManifest m;
  int line_no = 0;
  bool magic = false;
  bool world = false;
  bool end = false;
  std::vector<size_t> persistent;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_no;
    if (!magic) {
      if (line != kMagic) return bad(line_no, "unknown format");
      magic = true;
      continue;
    }
    if (end) return bad(line_no, "text after 'end'");
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    bool ok = true;
    if (f[0] == "world" && f.size() == 5) {
      ok = absl::SimpleAtoi(f[1], &m.ranks) && absl::SimpleAtoi(f[2], &m.group_elements) &&
           absl::SimpleAtoi(f[3], &m.alignment) && absl::SimpleAtoi(f[4], &m.stage) &&
           m.ranks > 0 && m.alignment > 0;
      m.checksums.assign(ok ? m.ranks : 0, {});
      world = ok;
    } else if (f[0] == "step" && f.size() == 5) {
      auto scale = parse_float(f[2]);
      ok = absl::SimpleAtoi(f[1], &m.step) && scale.ok() && absl::SimpleAtoi(f[3], &m.good_steps) &&
           absl::SimpleAtoi(f[4], &m.shard_steps);
      if (ok) m.loss_scale = *scale;
    } else if (f[0] == "nonce" && f.size() == 2) {
      ok = absl::SimpleHexAtoi(f[1], &m.nonce);
    } else if (f[0] == "adam" && f.size() == 7) {
      AdamGroup g;
      float* fields[] = {&g.lr, &g.beta1, &g.beta2, &g.eps, &g.weight_decay};
      for (int i = 0; i < 5 && ok; ++i) {
        auto x = parse_float(f[i + 1]);
        ok = x.ok();
        if (ok) *fields[i] = *x;
      }
      g.decoupled = f[6] == "1";
      m.groups.push_back(g);
    } else if (f[0] == "param" && f.size() >= 4) {
      ZeroLayoutParam p;
      size_t dims = 0;
      ok = absl::SimpleAtoi(f[1], &p.adam_group) && absl::SimpleAtoi(f[2], &dims) &&
           f.size() >= 4 + dims;
      p.count = 1;
      for (size_t d = 0; ok && d < dims; ++d) {
        int64_t extent = 0;
        ok = absl::SimpleAtoi(f[3 + d], &extent) && extent > 0;
        p.shape.push_back(extent);
        p.count *= static_cast<uint64_t>(extent);
      }
      if (ok) {
        const size_t name_at = static_cast<size_t>(f[3 + dims].data() - line.data());
        p.name = std::string(line.substr(name_at));
        m.params.push_back(std::move(p));
      }
    } else if (f[0] == "persistent" && f.size() >= 2) {
      for (size_t i = 1; ok && i < f.size(); ++i) {
        size_t index = 0;
        ok = absl::SimpleAtoi(f[i], &index);
        persistent.push_back(index);
      }
    } else if (f[0] == "checksum" && f.size() == 4 && world) {
      uint32_t rank = 0;
      uint32_t group = 0;
      uint64_t sum = 0;
      ok = absl::SimpleAtoi(f[1], &rank) && absl::SimpleAtoi(f[2], &group) &&
           absl::SimpleHexAtoi(f[3], &sum) && rank < m.ranks && group == m.checksums[rank].size();
      if (ok) m.checksums[rank].push_back(sum);
    } else if (f[0] == "end" && f.size() == 1) {
      end = true;
    } else {
      ok = false;
    }
    if (!ok) return bad(line_no, absl::StrCat("cannot read '", line, "'"));
  }
  if (!magic) return bad(1, "empty manifest");
  if (!world) return bad(line_no, "no 'world' line");
  if (!end) return bad(line_no, "no 'end' line: the manifest is truncated");
  for (size_t index : persistent) {
    if (index >= m.params.size()) {
      return bad(line_no, absl::StrFormat("persistent parameter %d of %d", index, m.params.size()));
    }
    m.params[index].persistent = true;
  }
  return m;
}

}  // namespace strata
