// The text format of both checkpoint manifests (optimizer.manifest, zero.manifest), read and
// written in one place so the two agree on versions, escaping and errors:
//
//   <format> <version>            first line, e.g. "strata-zero-checkpoint 1"
//   <key> <field> <field> ...     one record per line, fields separated by single spaces
//   end                           only in formats that mark completeness this way
//
// A record's last field may be free text holding spaces (a parameter's name): read it with
// ManifestLine::rest(). Floats are written as hex (bitwise round trips), ManifestHex as 16 hex
// digits. Every error names the file and line and says what wrote such a file.
#pragma once

#include <absl/status/statusor.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>

#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "strata/optimizer/offload_optimizer.h"

namespace strata {

struct ManifestFormat {
  absl::string_view name;    // the first line's word: "strata-zero-checkpoint"
  int version = 1;           // the one this build writes; it reads 1 up to this one
  absl::string_view what;    // starts every error: "ZeRO checkpoint"
  absl::string_view writer;  // what writes such files, for the fix: "ZeroEngine::save()"
  bool end_line = false;     // a last "end" line proves the manifest is complete
};

// A 64-bit value written as 16 hex digits (checksums, nonces).
struct ManifestHex {
  uint64_t value = 0;
};

class ManifestWriter {
 public:
  explicit ManifestWriter(const ManifestFormat& format);

  // One line: the key, then each field (integers in decimal, floats in hex, ManifestHex as 16
  // digits, a span of integers as one field each, text as it is: put a name last).
  template <typename... Fields>
  void add(absl::string_view key, const Fields&... fields) {
    text_.append(key.data(), key.size());
    (append(fields), ...);
    text_.push_back('\n');
  }
  // The text, with the "end" line where the format has one.
  std::string finish() &&;

 private:
  template <std::integral Int>
  void append(Int x) {
    absl::StrAppend(&text_, " ", x);
  }
  void append(bool) = delete;  // write flags as 0/1 explicitly
  void append(float x);
  void append(ManifestHex x);
  void append(absl::string_view text);
  void append(const std::string& text) { append(absl::string_view(text)); }
  void append(const char* text) { append(absl::string_view(text)); }
  void append(std::span<const int64_t> values);
  void append(const std::vector<int64_t>& values) { append(std::span<const int64_t>(values)); }

  ManifestFormat format_;
  std::string text_;
};

// One record as read: its key and fields. The getters return false when a field is missing or
// malformed; the reader then reports the line.
class ManifestLine {
 public:
  ManifestLine(int number, absl::string_view text);

  int number() const { return number_; }
  absl::string_view text() const { return text_; }
  absl::string_view key() const { return key_; }
  size_t size() const { return fields_.size(); }  // fields after the key
  absl::string_view field(size_t i) const { return i < fields_.size() ? fields_[i] : ""; }

  template <std::integral Int>
  bool get(size_t i, Int* out) const {
    return i < fields_.size() && absl::SimpleAtoi(fields_[i], out);
  }
  bool get(size_t i, float* out) const;
  bool get(size_t i, ManifestHex* out) const;
  // Field i to the end of the line, spaces included; false when there is no field i.
  bool rest(size_t i, std::string* out) const;

 private:
  int number_;
  absl::string_view text_;
  absl::string_view key_;
  std::vector<absl::string_view> fields_;
};

class ManifestReader {
 public:
  enum class Count { kOptional, kRequired, kRepeated };
  // Returns false when the record cannot be read ("cannot read '<line>'").
  using Handler = std::function<bool(const ManifestLine&)>;

  ManifestReader(const ManifestFormat& format, std::string path);

  // Lines with `key` and `min_fields` to `max_fields` fields after it go to `handler`; other
  // field counts, and unknown keys, are malformed lines.
  void on(absl::string_view key, size_t min_fields, size_t max_fields, Count count,
          Handler handler);
  // Checks the first line (format and version), hands each record to its handler, then checks
  // that every required key came and, where the format has one, the "end" line.
  absl::Status read(absl::string_view text);
  // DataLoss: "<what>: <path> line <n>: <why>; the checkpoint is damaged or not one written by
  // <writer>". For checks after read(), `line` = last_line().
  absl::Status error(int line, absl::string_view why) const;
  int last_line() const { return last_line_; }
  const std::string& path() const { return path_; }

 private:
  struct Key {
    std::string key;
    size_t min_fields;
    size_t max_fields;
    Count count;
    Handler handler;
    int seen = 0;
  };
  absl::Status read_first_line(const ManifestLine& line) const;

  ManifestFormat format_;
  std::string path_;
  std::vector<Key> keys_;
  int last_line_ = 0;
};

// Both formats' Adam group record: lr, beta1, beta2, eps, weight_decay (hex), decoupled (0/1).
void add_adam_group(ManifestWriter& writer, absl::string_view key, const AdamGroup& group);
// Reads every `key` record into `groups`, in order.
void read_adam_groups(ManifestReader& reader, absl::string_view key,
                      std::vector<AdamGroup>* groups);

// The text of a manifest file; NotFound "<what>: no <path>; is this a directory written by
// <writer>?" when it is absent.
absl::StatusOr<std::string> read_manifest_file(const ManifestFormat& format,
                                               const std::string& path);

}  // namespace strata
