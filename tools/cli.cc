#include "cli.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "strata/base/size.h"
#include "strata/base/text.h"

namespace strata::cli {

namespace {

// Debian's Abseil has its own string_view type; these convert at the boundary.
absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }
std::string_view sv(absl::string_view s) { return {s.data(), s.size()}; }

class StringFlag : public Flag {
 public:
  StringFlag(std::string name, std::string* out, std::string help)
      : Flag(std::move(name), std::move(help)), out_(out) {}

 private:
  absl::Status set(std::string_view value) override {
    *out_ = std::string(value);
    return absl::OkStatus();
  }
  std::string placeholder() const override { return "TEXT"; }
  std::string default_text() const override { return out_->empty() ? "" : "\"" + *out_ + "\""; }

  std::string* out_;
};

class BoolFlag : public Flag {
 public:
  BoolFlag(std::string name, bool* out, std::string help)
      : Flag(std::move(name), std::move(help)), out_(out) {}

 private:
  bool is_bool() const override { return true; }
  absl::Status set(std::string_view value) override {
    const std::string v = absl::AsciiStrToLower(av(value));
    if (v == "true" || v == "on" || v == "yes" || v == "1") {
      *out_ = true;
    } else if (v == "false" || v == "off" || v == "no" || v == "0") {
      *out_ = false;
    } else {
      return absl::InvalidArgumentError("expected true, false, on or off");
    }
    return absl::OkStatus();
  }
  std::string placeholder() const override { return ""; }
  std::string default_text() const override { return *out_ ? "on" : "off"; }

  bool* out_;
};

class Uint64Flag : public Flag {
 public:
  Uint64Flag(std::string name, uint64_t* out, std::string help)
      : Flag(std::move(name), std::move(help)), out_(out) {}

 private:
  absl::Status set(std::string_view value) override {
    if (!absl::SimpleAtoi(av(value), out_)) {
      return absl::InvalidArgumentError("expected a non-negative integer such as 0 or 42");
    }
    return absl::OkStatus();
  }
  std::string placeholder() const override { return "N"; }
  std::string default_text() const override { return absl::StrCat(*out_); }

  uint64_t* out_;
};

class DoubleFlag : public Flag {
 public:
  DoubleFlag(std::string name, double* out, std::string help)
      : Flag(std::move(name), std::move(help)), out_(out) {}

 private:
  absl::Status set(std::string_view value) override {
    if (!absl::SimpleAtod(av(value), out_) || !std::isfinite(*out_)) {
      return absl::InvalidArgumentError("expected a finite number such as 0.5 or 3");
    }
    return absl::OkStatus();
  }
  std::string placeholder() const override { return "X"; }
  std::string default_text() const override { return absl::StrCat(*out_); }

  double* out_;
};

class SizeFlag : public Flag {
 public:
  SizeFlag(std::string name, uint64_t* out, std::string help, bool zero_ok)
      : Flag(std::move(name), std::move(help)), out_(out), zero_ok_(zero_ok) {}

 private:
  absl::Status set(std::string_view value) override {
    if (zero_ok_ && value == "0") {
      *out_ = 0;
      return absl::OkStatus();
    }
    absl::StatusOr<uint64_t> bytes = parse_size(value);  // its message names the accepted form
    if (!bytes.ok()) return bytes.status();
    *out_ = *bytes;
    return absl::OkStatus();
  }
  std::string placeholder() const override { return "SIZE"; }
  std::string default_text() const override { return *out_ == 0 ? "" : format_bytes(*out_); }

  uint64_t* out_;
  bool zero_ok_;
};

class EnumFlag : public Flag {
 public:
  EnumFlag(std::string name, std::string* out, std::vector<std::string> choices, std::string help)
      : Flag(std::move(name), std::move(help)), out_(out), choices_(std::move(choices)) {}

 private:
  absl::Status set(std::string_view value) override {
    if (std::find(choices_.begin(), choices_.end(), value) == choices_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected one of ", absl::StrJoin(choices_, ", ")));
    }
    *out_ = std::string(value);
    return absl::OkStatus();
  }
  std::string placeholder() const override { return absl::StrJoin(choices_, "|"); }
  std::string default_text() const override { return *out_; }

  std::string* out_;
  std::vector<std::string> choices_;
};

}  // namespace

FlagSet::FlagSet(std::string program, std::string summary, std::string positional)
    : program_(std::move(program)),
      summary_(std::move(summary)),
      positional_(std::move(positional)) {}

Flag& FlagSet::add(std::unique_ptr<Flag> flag) {
  flags_.push_back(std::move(flag));
  return *flags_.back();
}

Flag& FlagSet::add_string(std::string name, std::string* out, std::string help) {
  return add(std::make_unique<StringFlag>(std::move(name), out, std::move(help)));
}
Flag& FlagSet::add_bool(std::string name, bool* out, std::string help) {
  return add(std::make_unique<BoolFlag>(std::move(name), out, std::move(help)));
}
Flag& FlagSet::add_uint64(std::string name, uint64_t* out, std::string help) {
  return add(std::make_unique<Uint64Flag>(std::move(name), out, std::move(help)));
}
Flag& FlagSet::add_double(std::string name, double* out, std::string help) {
  return add(std::make_unique<DoubleFlag>(std::move(name), out, std::move(help)));
}
Flag& FlagSet::add_size(std::string name, uint64_t* out, std::string help, bool zero_ok) {
  return add(std::make_unique<SizeFlag>(std::move(name), out, std::move(help), zero_ok));
}
Flag& FlagSet::add_enum(std::string name, std::string* out, std::vector<std::string> choices,
                        std::string help) {
  return add(std::make_unique<EnumFlag>(std::move(name), out, std::move(choices), std::move(help)));
}

Flag* FlagSet::find(std::string_view name) const {
  for (const auto& flag : flags_) {
    if (flag->name() == name) return flag.get();
  }
  return nullptr;
}

std::string FlagSet::closest_name(std::string_view name) const {
  std::vector<std::string_view> names;
  for (const auto& flag : flags_) names.emplace_back(flag->name());
  // About one edit per three characters, at least two: "--sise" is --size, "--foo" nothing.
  const text::Nearest best = text::nearest(name, names);
  if (best.distance <= std::max<size_t>(2, name.size() / 3)) return std::string(best.name);
  return text::edit_distance(name, "help") <= 2 ? "help" : "";
}

absl::StatusOr<std::vector<std::string>> FlagSet::parse(int argc, const char* const* argv) {
  std::vector<std::string> positional;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      help_requested_ = true;
      return positional;
    }
    if (arg[1] != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option '", av(arg), "': flags are written --name=value"));
    }
    const std::string_view body = arg.substr(2);
    const size_t eq = body.find('=');
    const std::string_view name = body.substr(0, eq);
    Flag* flag = find(name);
    if (flag == nullptr) {
      std::string hint = closest_name(name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", av(name),
                       hint.empty() ? "" : absl::StrCat("; did you mean --", hint, "?")));
    }
    std::string_view value;
    if (eq != std::string_view::npos) {
      value = body.substr(eq + 1);
    } else if (flag->is_bool()) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      const std::string form = absl::StrCat("--", av(name), "=", flag->placeholder());
      return absl::InvalidArgumentError(
          flag->value_message_ ? flag->value_message_(std::nullopt, absl::StrCat("needs ", form))
                               : absl::StrCat("flag --", av(name), " needs a value: ", form));
    }
    if (absl::Status st = flag->set(value); !st.ok()) {
      return absl::InvalidArgumentError(
          flag->value_message_
              ? flag->value_message_(value, sv(st.message()))
              : absl::StrCat("bad value '", av(value), "' for --", av(name), ": ", st.message()));
    }
    flag->set_ = true;
  }
  for (const auto& flag : flags_) {
    if (flag->is_required() && !flag->was_set()) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing required flag --", flag->name(), "=", flag->placeholder()));
    }
  }
  return positional;
}

std::string FlagSet::usage() const {
  std::string out = absl::StrCat("usage: ", program_, " [flags]", positional_.empty() ? "" : " ",
                                 positional_, "\n\n", summary_, "\n\nflags:\n");
  for (const auto& flag : flags_) {
    std::string form = absl::StrCat("  --", flag->name());
    if (!flag->is_bool()) absl::StrAppend(&form, "=", flag->placeholder());
    std::string note;
    if (flag->is_required()) {
      note = " (required)";
    } else if (std::string d = flag->default_text(); !d.empty()) {
      note = absl::StrCat(" (default: ", d, ")");
    }
    absl::StrAppend(&out, form, "\n      ", flag->help_, note, "\n");
  }
  absl::StrAppend(&out, "  --help, -h\n      print this help and exit\n");
  return out;
}

std::string error_line(std::string_view program, std::string_view message) {
  while (!message.empty() && absl::ascii_isspace(static_cast<unsigned char>(message.back()))) {
    message.remove_suffix(1);
  }
  std::string line(program);
  line.append(": ").append(message).append("\n");
  return line;
}

int print_error(std::string_view program, std::string_view message, int exit_code) {
  std::cerr << error_line(program, message) << std::flush;
  return exit_code;
}

int usage_error(std::string_view program, std::string_view message) {
  std::cerr << error_line(program, message) << "Run '" << program << " --help' for usage.\n"
            << std::flush;
  return kUsageExitCode;
}

int FlagSet::usage_error(std::string_view message) const {
  return cli::usage_error(program_, message);
}

std::optional<int> FlagSet::parse_or_exit(int argc, const char* const* argv,
                                          std::vector<std::string>* positional) {
  absl::StatusOr<std::vector<std::string>> parsed = parse(argc, argv);
  if (!parsed.ok()) return usage_error(sv(parsed.status().message()));
  if (help_requested_) {
    std::cout << usage();
    return 0;
  }
  *positional = std::move(*parsed);
  return std::nullopt;
}

}  // namespace strata::cli
