// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <iterator>
#include <string>
#include <system_error>

namespace strata::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "strata-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::string& path() const { return path_; }
  // Names in the directory (swap files must never have one).
  size_t entries() const {
    return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(path_),
                                             std::filesystem::directory_iterator{}));
  }

 private:
  std::string path_;
};

}  // namespace strata::testing
