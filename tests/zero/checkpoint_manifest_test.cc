// The checkpoint manifests' one reader and writer (strata/optimizer/checkpoint_manifest.h): its
// errors, round trips, and the ZeRO manifest as version 1 files hold it (old checkpoints keep
// loading).
#include "strata/optimizer/checkpoint_manifest.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "zero/zero_manifest.h"

namespace strata {
namespace {

// Version 2, with an "end" line.
constexpr ManifestFormat kTest{"strata-test-checkpoint", 2, "test checkpoint", "the test's writer",
                               true};

// A reader for kTest: "size <n>" required, "scale <float>" optional, "item <n> <name>" repeated.
struct Parsed {
  uint64_t size = 0;
  float scale = 0;
  std::vector<std::pair<uint32_t, std::string>> items;
};

absl::Status parse(const std::string& text, Parsed* out) {
  using Count = ManifestReader::Count;
  ManifestReader reader(kTest, "/ckpt/test.manifest");
  reader.on("size", 1, 1, Count::kRequired,
            [&](const ManifestLine& l) { return l.get(0, &out->size); });
  reader.on("scale", 1, 1, Count::kOptional,
            [&](const ManifestLine& l) { return l.get(0, &out->scale); });
  reader.on("item", 2, SIZE_MAX, Count::kRepeated, [&](const ManifestLine& l) {
    std::pair<uint32_t, std::string> item;
    if (!l.get(0, &item.first) || !l.rest(1, &item.second)) return false;
    out->items.push_back(item);
    return true;
  });
  return reader.read(text);
}

bool contains(const absl::Status& st, absl::string_view text) {
  return absl::StrContains(st.message(), text);
}

TEST_CASE("manifest: written records read back, names with spaces and floats bitwise") {
  const std::vector<float> floats = {0.1F,
                                     -0.0F,
                                     1e-30F,
                                     std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::infinity(),
                                     3.0F};
  for (float x : floats) {
    ManifestWriter w(kTest);
    w.add("size", uint64_t{1} << 40);
    w.add("scale", x);
    w.add("item", 7U, "layer 3 . weight");
    w.add("item", 8U, "b");
    const std::string text = std::move(w).finish();
    CHECK(absl::StartsWith(text, "strata-test-checkpoint 2\nsize 1099511627776\nscale "));
    CHECK(absl::EndsWith(text, "item 7 layer 3 . weight\nitem 8 b\nend\n"));
    Parsed p;
    REQUIRE(parse(text, &p).ok());
    CHECK(p.size == uint64_t{1} << 40);
    CHECK(std::bit_cast<uint32_t>(p.scale) == std::bit_cast<uint32_t>(x));
    REQUIRE(p.items.size() == 2);
    CHECK(p.items[0] == std::pair<uint32_t, std::string>{7, "layer 3 . weight"});
    CHECK(p.items[1] == std::pair<uint32_t, std::string>{8, "b"});
  }
}

TEST_CASE("manifest: older versions read, an unknown version or format is refused clearly") {
  Parsed p;
  CHECK(parse("strata-test-checkpoint 1\nsize 3\nend\n", &p).ok());
  CHECK(p.size == 3);

  const absl::Status newer = parse("strata-test-checkpoint 3\nsize 3\nend\n", &p);
  CHECK(newer.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(newer, "test checkpoint: /ckpt/test.manifest line 1: format version 3"));
  CHECK(contains(newer, "reads versions 1 to 2"));
  CHECK(contains(newer, "load it with the strata release that wrote it, or a newer one"));

  const absl::Status other = parse("strata-zero-checkpoint 1\nsize 3\nend\n", &p);
  CHECK(other.code() == absl::StatusCode::kDataLoss);
  CHECK(contains(other,
                 "/ckpt/test.manifest line 1: unknown format: it begins "
                 "'strata-zero-checkpoint 1', not 'strata-test-checkpoint 2'"));
  CHECK(contains(other, "not one written by the test's writer"));
  CHECK(contains(parse("strata-test-checkpoint two\nsize 3\nend\n", &p), "unknown format"));
  CHECK(contains(parse("", &p), "line 1: empty manifest"));
}

TEST_CASE("manifest: a malformed line, a missing key, a cut or extended file name the line") {
  Parsed p;
  auto check = [&](const std::string& body, absl::string_view why) {
    const absl::Status st = parse(absl::StrCat("strata-test-checkpoint 2\n", body), &p);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(contains(st, why));
    CHECK(contains(st, "/ckpt/test.manifest"));
    CHECK(contains(st, "the checkpoint is damaged or not one written by the test's writer"));
  };
  check("size 3\nscale 0x1.8p+1x\nend\n", "line 3: cannot read 'scale 0x1.8p+1x'");
  check("size -3\nend\n", "line 2: cannot read 'size -3'");
  check("size 3 4\nend\n", "line 2: cannot read 'size 3 4'");
  check("size 3\nitem 5\nend\n", "line 3: cannot read 'item 5'");
  check("size 3\nweight 5\nend\n", "line 3: cannot read 'weight 5'");
  check("scale 0x1p+0\nend\n", "line 3: no 'size' line");
  check("size 3\nsize 4\nend\n", "line 3: a second 'size' line");
  check("size 3\nitem 1 a\n", "line 3: no 'end' line: the manifest is truncated");
  check("size 3\nend\nitem 1 a\n", "line 4: text after 'end'");
}

TEST_CASE("manifest: a ZeRO manifest as version 1 writes it still reads, and round-trips") {
  // What ZeroEngine::save() has written since the format began (persistent since stage 3).
  const std::string v1 =
      "strata-zero-checkpoint 1\n"
      "world 2 1024 64 3\n"
      "step 5 0x1p+15 4 5\n"
      "nonce 00000000deadbeef\n"
      "adam 0x1.0624dep-10 0x1.ccccccp-1 0x1.ff7ceep-1 0x1.0c6f7ap-20 0x1.47ae14p-7 1\n"
      "param 0 2 4 8 layers.0 weight\n"
      "param 0 1 16 bias\n"
      "persistent 1\n"
      "checksum 0 0 0123456789abcdef\n"
      "checksum 1 0 fedcba9876543210\n"
      "end\n";
  auto m = parse_zero_manifest(v1, "/ckpt/zero.manifest");
  REQUIRE(m.ok());
  CHECK(m->ranks == 2);
  CHECK(m->group_elements == 1024);
  CHECK(m->alignment == 64);
  CHECK(m->stage == 3);
  CHECK(m->step == 5);
  CHECK(m->loss_scale == 32768.0F);
  CHECK(m->good_steps == 4);
  CHECK(m->shard_steps == 5);
  CHECK(m->nonce == 0xdeadbeef);
  REQUIRE(m->groups.size() == 1);
  CHECK(m->groups[0].decoupled);
  REQUIRE(m->params.size() == 2);
  CHECK(m->params[0].name == "layers.0 weight");
  CHECK(m->params[0].shape == std::vector<int64_t>{4, 8});
  CHECK(m->params[0].count == 32);
  CHECK_FALSE(m->params[0].persistent);
  CHECK(m->params[1].persistent);
  CHECK(m->checksums ==
        std::vector<std::vector<uint64_t>>{{0x0123456789abcdef}, {0xfedcba9876543210}});
  CHECK(m->rank_file(1) == "zero-00000000deadbeef-rank1.state");
  // Written again, byte for byte: the writer still speaks version 1.
  CHECK(render(*m) == v1);

  auto no_world = parse_zero_manifest("strata-zero-checkpoint 1\nstep 5 0x1p+0 0 0\nend\n",
                                      "/ckpt/zero.manifest");
  CHECK(no_world.status().code() == absl::StatusCode::kDataLoss);
  CHECK(contains(no_world.status(), "ZeRO checkpoint: /ckpt/zero.manifest line 3: no 'world'"));
  auto bad_persistent = parse_zero_manifest(
      "strata-zero-checkpoint 1\nworld 1 8 1 3\nparam 0 1 8 w\npersistent 4\nend\n", "/z");
  CHECK(contains(bad_persistent.status(), "persistent parameter 4 of 1"));
  auto missing = read_zero_manifest("/nonexistent/zero.manifest");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(contains(missing.status(), "is this a directory written by ZeroEngine::save()?"));
}

}  // namespace
}  // namespace strata
