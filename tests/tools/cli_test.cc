// The tools' flag parser: forms, typed values, errors and usage text.
#include "cli.h"

#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::cli {
namespace {

struct Parsed {
  absl::StatusOr<std::vector<std::string>> result;
  std::string error() const { return std::string(result.status().message()); }
};

// Flags of every type, with defaults.
struct Fixture {
  FlagSet flags{"tool", "Does things.", "FILE"};
  std::string name = "default";
  bool verbose = false;
  uint64_t count = 3;
  double ratio = 0.5;
  uint64_t bytes = 4096;
  std::string mode = "fast";

  Fixture() {
    flags.add_string("name", &name, "a name");
    flags.add_bool("verbose", &verbose, "talk more");
    flags.add_uint64("count", &count, "how many");
    flags.add_double("ratio", &ratio, "a fraction");
    flags.add_size("bytes", &bytes, "how much");
    flags.add_enum("mode", &mode, {"fast", "slow"}, "how");
  }
  Parsed parse(std::vector<const char*> args) {
    args.insert(args.begin(), "tool");
    return Parsed{flags.parse(static_cast<int>(args.size()), args.data())};
  }
};

TEST_CASE("values in both forms, and positional arguments", "[cli]") {
  Fixture f;
  Parsed p = f.parse({"in.txt", "--name=x", "--count", "7", "--ratio=0.25", "--bytes", "64MiB",
                      "--mode=slow", "--verbose", "-", "--", "--not-a-flag"});
  REQUIRE(p.result.ok());
  CHECK(*p.result == std::vector<std::string>{"in.txt", "-", "--not-a-flag"});
  CHECK(f.name == "x");
  CHECK(f.count == 7);
  CHECK(f.ratio == 0.25);
  CHECK(f.bytes == 64ull << 20);
  CHECK(f.mode == "slow");
  CHECK(f.verbose);
  CHECK(!f.flags.help_requested());
}

TEST_CASE("defaults stay when flags are absent", "[cli]") {
  Fixture f;
  REQUIRE(f.parse({}).result.ok());
  CHECK(f.name == "default");
  CHECK(f.count == 3);
  CHECK(f.bytes == 4096);
  CHECK(!f.verbose);
}

TEST_CASE("booleans accept true/false/on/off and never take the next argument", "[cli]") {
  for (const char* off : {"--verbose=false", "--verbose=off", "--verbose=0", "--verbose=no"}) {
    Fixture f;
    f.verbose = true;
    REQUIRE(f.parse({off}).result.ok());
    CHECK(!f.verbose);
  }
  Fixture f;
  Parsed p = f.parse({"--verbose", "trace.txt"});
  REQUIRE(p.result.ok());
  CHECK(f.verbose);
  CHECK(*p.result == std::vector<std::string>{"trace.txt"});
  REQUIRE(f.parse({"--verbose=ON"}).result.ok());
  Parsed bad = f.parse({"--verbose=maybe"});
  REQUIRE(absl::IsInvalidArgument(bad.result.status()));
  CHECK_THAT(bad.error(), Catch::Contains("'maybe'") && Catch::Contains("--verbose") &&
                              Catch::Contains("true, false, on or off"));
}

TEST_CASE("errors name the flag, the value and the accepted form", "[cli]") {
  Fixture f;
  CHECK_THAT(f.parse({"--count=-1"}).error(), Catch::Contains("'-1'") &&
                                                  Catch::Contains("--count") &&
                                                  Catch::Contains("non-negative integer"));
  CHECK_THAT(f.parse({"--count=1x"}).error(), Catch::Contains("--count"));
  CHECK_THAT(f.parse({"--ratio=abc"}).error(),
             Catch::Contains("--ratio") && Catch::Contains("number"));
  CHECK_THAT(f.parse({"--ratio=inf"}).error(), Catch::Contains("finite"));
  CHECK_THAT(f.parse({"--bytes=12XB"}).error(),
             Catch::Contains("'12XB'") && Catch::Contains("--bytes") && Catch::Contains("512KiB"));
  CHECK_THAT(f.parse({"--mode=medium"}).error(),
             Catch::Contains("'medium'") && Catch::Contains("one of fast, slow"));
  CHECK_THAT(f.parse({"--count"}).error(),
             Catch::Contains("--count needs a value") && Catch::Contains("--count=N"));
  CHECK_THAT(f.parse({"-x"}).error(), Catch::Contains("unknown option '-x'"));
}

TEST_CASE("a flag's own message replaces the parser's for a bad or missing value", "[cli]") {
  Fixture f;
  uint64_t window = 1024;
  f.flags.add_size("window", &window, "a window", /*zero_ok=*/true)
      .value_message([](std::optional<std::string_view> value, std::string_view why) {
        return value ? "--window=" + std::string(why) + " (or 0)"
                     : "--window wants a size, e.g. --window=64KiB (" + std::string(why) + ")";
      });
  CHECK_THAT(f.parse({"--window=lots"}).error(),
             Catch::StartsWith("--window='lots'") && Catch::EndsWith(" (or 0)"));
  CHECK(f.parse({"--window"}).error() ==
        "--window wants a size, e.g. --window=64KiB (needs --window=SIZE)");
  // 0 where allowed, and still refused by a size flag without zero_ok.
  REQUIRE(f.parse({"--window=0"}).result.ok());
  CHECK(window == 0);
  CHECK_THAT(f.parse({"--bytes=0"}).error(), Catch::StartsWith("bad value '0' for --bytes"));
}

TEST_CASE("unknown flags suggest the closest name", "[cli]") {
  Fixture f;
  CHECK_THAT(f.parse({"--verbos"}).error(),
             Catch::Contains("unknown flag --verbos") && Catch::Contains("did you mean --verbose"));
  CHECK_THAT(f.parse({"--byte=1"}).error(), Catch::Contains("did you mean --bytes"));
  CHECK_THAT(f.parse({"--hlep"}).error(), Catch::Contains("did you mean --help"));
  std::string far = f.parse({"--completely-different"}).error();
  CHECK_THAT(far, Catch::Contains("unknown flag --completely-different"));
  CHECK_THAT(far, !Catch::Contains("did you mean"));
}

TEST_CASE("required flags must be given, except with --help", "[cli]") {
  FlagSet flags("tool", "Does things.");
  uint64_t capacity = 0;
  flags.add_size("capacity", &capacity, "arena size").required();
  std::vector<const char*> none{"tool"};
  auto missing = flags.parse(1, none.data());
  REQUIRE(absl::IsInvalidArgument(missing.status()));
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("missing required flag --capacity=SIZE"));
  std::vector<const char*> help{"tool", "-h"};
  REQUIRE(flags.parse(2, help.data()).ok());
  CHECK(flags.help_requested());
  std::vector<const char*> given{"tool", "--capacity=1GiB"};
  FlagSet again("tool", "Does things.");
  again.add_size("capacity", &capacity, "arena size").required();
  REQUIRE(again.parse(2, given.data()).ok());
  CHECK(capacity == 1ull << 30);
}

TEST_CASE("usage lists every flag with its help and default", "[cli]") {
  Fixture f;
  REQUIRE(f.parse({"--help"}).result.ok());
  CHECK(f.flags.help_requested());
  const std::string usage = f.flags.usage();
  CHECK_THAT(usage, Catch::StartsWith("usage: tool [flags] FILE\n\nDoes things."));
  CHECK_THAT(usage, Catch::Contains("--name=TEXT\n      a name (default: \"default\")"));
  CHECK_THAT(usage, Catch::Contains("--verbose\n      talk more (default: off)"));
  CHECK_THAT(usage, Catch::Contains("--count=N\n      how many (default: 3)"));
  CHECK_THAT(usage, Catch::Contains("--ratio=X\n      a fraction (default: 0.5)"));
  CHECK_THAT(usage, Catch::Contains("--bytes=SIZE\n      how much (default: 4.00 KiB)"));
  CHECK_THAT(usage, Catch::Contains("--mode=fast|slow\n      how (default: fast)"));
  CHECK_THAT(usage, Catch::Contains("--help, -h"));
}

TEST_CASE("error lines end with exactly one newline", "[cli]") {
  CHECK(error_line("tool", "it broke") == "tool: it broke\n");
  CHECK(error_line("tool", "it broke\n") == "tool: it broke\n");
  CHECK(error_line("tool", "two lines\n  second\n\n ") == "tool: two lines\n  second\n");
  CHECK(error_line("tool", "") == "tool: \n");
}

}  // namespace
}  // namespace strata::cli
