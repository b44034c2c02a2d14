#include "strata/optimizer/checkpoint_manifest.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace strata {
namespace {

constexpr absl::string_view kEnd = "end";

}  // namespace

ManifestWriter::ManifestWriter(const ManifestFormat& format) : format_(format) {
  text_ = absl::StrCat(format.name, " ", format.version, "\n");
}

std::string ManifestWriter::finish() && {
  if (format_.end_line) absl::StrAppend(&text_, kEnd, "\n");
  return std::move(text_);
}

void ManifestWriter::append(float x) { absl::StrAppend(&text_, " ", absl::StrFormat("%a", x)); }

void ManifestWriter::append(ManifestHex x) {
  absl::StrAppend(&text_, " ", absl::StrFormat("%016x", x.value));
}

void ManifestWriter::append(absl::string_view text) { absl::StrAppend(&text_, " ", text); }

void ManifestWriter::append(std::span<const int64_t> values) {
  for (int64_t v : values) append(v);
}

ManifestLine::ManifestLine(int number, absl::string_view text) : number_(number), text_(text) {
  std::vector<absl::string_view> words = absl::StrSplit(text, ' ');
  key_ = words[0];
  fields_.assign(words.begin() + 1, words.end());
}

bool ManifestLine::get(size_t i, float* out) const {
  if (i >= fields_.size() || fields_[i].empty()) return false;
  const std::string s(fields_[i]);
  char* end = nullptr;
  errno = 0;
  const float x = std::strtof(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0) return false;
  *out = x;
  return true;
}

bool ManifestLine::get(size_t i, ManifestHex* out) const {
  return i < fields_.size() && absl::SimpleHexAtoi(fields_[i], &out->value);
}

bool ManifestLine::rest(size_t i, std::string* out) const {
  if (i >= fields_.size()) return false;
  *out = std::string(text_.substr(static_cast<size_t>(fields_[i].data() - text_.data())));
  return true;
}

ManifestReader::ManifestReader(const ManifestFormat& format, std::string path)
    : format_(format), path_(std::move(path)) {}

void ManifestReader::on(absl::string_view key, size_t min_fields, size_t max_fields, Count count,
                        Handler handler) {
  keys_.push_back(Key{std::string(key), min_fields, max_fields, count, std::move(handler)});
}

absl::Status ManifestReader::error(int line, absl::string_view why) const {
  return absl::DataLossError(
      absl::StrFormat("%s: %s line %d: %s; the checkpoint is damaged or not one written by %s",
                      format_.what, path_, line, why, format_.writer));
}

absl::Status ManifestReader::read_first_line(const ManifestLine& line) const {
  int version = 0;
  if (line.key() != format_.name || line.size() != 1 || !line.get(0, &version)) {
    return error(line.number(), absl::StrFormat("unknown format: it begins '%s', not '%s %d'",
                                                line.text(), format_.name, format_.version));
  }
  if (version < 1 || version > format_.version) {
    // Not damage: a newer writer. Say which build reads it rather than "damaged".
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: %s line %d: format version %d, and this build of strata reads versions 1 to %d; "
        "load it with the strata release that wrote it, or a newer one",
        format_.what, path_, line.number(), version, format_.version));
  }
  return absl::OkStatus();
}

absl::Status ManifestReader::read(absl::string_view text) {
  bool first = true;
  bool ended = false;
  last_line_ = 0;
  for (Key& k : keys_) k.seen = 0;
  for (absl::string_view text_line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const ManifestLine line(++last_line_, text_line);
    if (first) {
      if (auto st = read_first_line(line); !st.ok()) return st;
      first = false;
      continue;
    }
    if (ended) return error(line.number(), "text after 'end'");
    if (format_.end_line && line.key() == kEnd && line.size() == 0) {
      ended = true;
      continue;
    }
    Key* key = nullptr;
    for (Key& k : keys_) {
      if (k.key == line.key()) key = &k;
    }
    if (key == nullptr || line.size() < key->min_fields || line.size() > key->max_fields ||
        !key->handler(line)) {
      return error(line.number(), absl::StrCat("cannot read '", line.text(), "'"));
    }
    if (++key->seen > 1 && key->count != Count::kRepeated) {
      return error(line.number(), absl::StrCat("a second '", key->key, "' line"));
    }
  }
  if (first) return error(1, "empty manifest");
  if (format_.end_line && !ended) {
    return error(last_line_, "no 'end' line: the manifest is truncated");
  }
  for (const Key& k : keys_) {
    if (k.count == Count::kRequired && k.seen == 0) {
      return error(last_line_, absl::StrCat("no '", k.key, "' line"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> read_manifest_file(const ManifestFormat& format,
                                               const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        format.what, ": no ", path, "; is this a directory written by ", format.writer, "?"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void add_adam_group(ManifestWriter& writer, absl::string_view key, const AdamGroup& g) {
  writer.add(key, g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, g.decoupled ? 1 : 0);
}

void read_adam_groups(ManifestReader& reader, absl::string_view key,
                      std::vector<AdamGroup>* groups) {
  reader.on(key, 6, 6, ManifestReader::Count::kRepeated, [groups](const ManifestLine& line) {
    AdamGroup g;
    int decoupled = 0;
    if (!line.get(0, &g.lr) || !line.get(1, &g.beta1) || !line.get(2, &g.beta2) ||
        !line.get(3, &g.eps) || !line.get(4, &g.weight_decay) || !line.get(5, &decoupled) ||
        (decoupled != 0 && decoupled != 1)) {
      return false;
    }
    g.decoupled = decoupled == 1;
    groups->push_back(g);
    return true;
  });
}

}  // namespace strata
