// strata::cli — the small flag parser shared by the tools (strata-info, arena-replay,
// offload-bench, ...) and examples/cpp_trainer.
//
//   --name=value   --name value   --flag (boolean true)   --flag=true|false|on|off|1|0|yes|no
//   --             ends the flags; everything after it is positional ("-" is positional too)
//   --help, -h     prints usage to stdout
//
// Boolean flags never take a separate value, so "--json trace.txt" keeps trace.txt positional.
// Errors name the flag, the value and the accepted form; an unknown flag suggests the closest
// known name.
//
// A tool's main stays short:
//   cli::FlagSet flags("arena-replay", "Replays an allocation trace.", "TRACE");
//   uint64_t capacity = 0;
//   flags.add_size("capacity", &capacity, "arena size").required();
//   std::vector<std::string> args;
//   if (std::optional<int> exit_code = flags.parse_or_exit(argc, argv, &args)) return *exit_code;
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::cli {

// Exit code for usage errors (bad flags or arguments), as for most Unix tools.
inline constexpr int kUsageExitCode = 2;

class Flag {
 public:
  virtual ~Flag() = default;

  // The flag must be given on the command line.
  Flag& required() {
    required_ = true;
    return *this;
  }
  // The message for a bad value of this flag (`value`), or a missing one (nullopt), in place of
  // the parser's ("bad value 'x' for --name: <why>", "flag --name needs a value: ..."; `why` is
  // the parser's reason): for a program whose messages say more about its own flags.
  using ValueMessage =
      std::function<std::string(std::optional<std::string_view> value, std::string_view why)>;
  Flag& value_message(ValueMessage message) {
    value_message_ = std::move(message);
    return *this;
  }

  const std::string& name() const { return name_; }
  bool is_required() const { return required_; }
  bool was_set() const { return set_; }

 protected:
  Flag(std::string name, std::string help) : name_(std::move(name)), help_(std::move(help)) {}

 private:
  friend class FlagSet;

  virtual bool is_bool() const { return false; }
  // Parses and stores `value`; the error says which form is accepted, without the flag name.
  virtual absl::Status set(std::string_view value) = 0;
  // For usage: the value placeholder ("SIZE") and the default as the user would write it.
  virtual std::string placeholder() const = 0;
  virtual std::string default_text() const = 0;

  std::string name_;
  std::string help_;
  ValueMessage value_message_;
  bool required_ = false;
  bool set_ = false;
};

// "<program>: <message>\n": one whole line however `message` ends (trailing newlines and
// spaces dropped), so that an error never runs into the shell's next prompt.
std::string error_line(std::string_view program, std::string_view message);
// Writes error_line() to stderr and returns `exit_code`; tools return it from main.
int print_error(std::string_view program, std::string_view message, int exit_code = 1);
// A usage error found after parsing (a combination of flags, a value out of range): error_line(),
// then "Run '<program> --help' for usage.", to stderr; returns kUsageExitCode.
int usage_error(std::string_view program, std::string_view message);

class FlagSet {
 public:
  // `positional` names the positional arguments in the usage line ("TRACE", "[FILE...]").
  FlagSet(std::string program, std::string summary, std::string positional = "");

  // Each flag writes into `*out`; the value `*out` holds when added is the default.
  Flag& add_string(std::string name, std::string* out, std::string help);
  Flag& add_bool(std::string name, bool* out, std::string help);
  Flag& add_uint64(std::string name, uint64_t* out, std::string help);
  Flag& add_double(std::string name, double* out, std::string help);
  // Byte sizes as strata::parse_size accepts them: 4096, 512KiB, 64MiB, 1.5GB; and 0 too where
  // `zero_ok`.
  Flag& add_size(std::string name, uint64_t* out, std::string help, bool zero_ok = false);
  // A string restricted to `choices`.
  Flag& add_enum(std::string name, std::string* out, std::vector<std::string> choices,
                 std::string help);

  // Parses argv[1..argc); returns the positional arguments. InvalidArgument on a usage error.
  // After --help, help_requested() is true and parsing stops (required flags are not checked).
  absl::StatusOr<std::vector<std::string>> parse(int argc, const char* const* argv);

  bool help_requested() const { return help_requested_; }
  std::string usage() const;

  // Prints `message`, then "Run '<prog> --help' for usage.", to stderr; returns kUsageExitCode.
  int usage_error(std::string_view message) const;

  // parse() for a tool's main: on --help prints usage and returns 0; on a usage error prints it
  // and returns kUsageExitCode; returns nullopt when the tool should run.
  std::optional<int> parse_or_exit(int argc, const char* const* argv,
                                   std::vector<std::string>* positional);

 private:
  Flag& add(std::unique_ptr<Flag> flag);
  Flag* find(std::string_view name) const;
  std::string closest_name(std::string_view name) const;

  std::string program_;
  std::string summary_;
  std::string positional_;
  std::vector<std::unique_ptr<Flag>> flags_;
  bool help_requested_ = false;
};

}  // namespace strata::cli
