#include "strata/base/system.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>

#include "temp_dir.h"

namespace strata {
namespace {

int entries_in(const std::string& dir) {
  int count = 0;
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") ++count;
  }
  closedir(d);
  return count;
}

TEST_CASE("errno_text names the error and its number", "[base]") {
  CHECK(sys::errno_text(ENOSPC) == "No space left on device (errno 28)");
  CHECK(sys::errno_text(EIO) == "Input/output error (errno 5)");
}

TEST_CASE("open_unnamed gives a writable file that no name points at", "[base]") {
  testing::TempDir dir;
  for (const int flags : {0, O_DIRECT}) {
    sys::UnnamedFile file = sys::open_unnamed(dir.path(), flags);
    if (!file.fd) {
      // O_DIRECT may be refused by this file system; the plain file must always work.
      REQUIRE(flags == O_DIRECT);
      CHECK(file.error == EINVAL);
      continue;
    }
    CHECK(file.error == 0);
    CHECK(entries_in(dir.path()) == 0);
    if (flags == 0) {
      const char text[] = "strata";
      CHECK(::pwrite(file.fd.get(), text, sizeof text, 0) == static_cast<ssize_t>(sizeof text));
      char back[sizeof text] = {};
      CHECK(::pread(file.fd.get(), back, sizeof back, 0) == static_cast<ssize_t>(sizeof back));
      CHECK(std::string(back) == "strata");
    }
  }
  CHECK(entries_in(dir.path()) == 0);
}

TEST_CASE("open_unnamed in a missing directory reports its errno", "[base]") {
  sys::UnnamedFile file = sys::open_unnamed("/nonexistent/strata-base-test", 0);
  CHECK(!file.fd);
  CHECK(file.error == ENOENT);
}

}  // namespace
}  // namespace strata
