#include "strata/base/text.h"

#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

using strata::text::edit_distance;
using strata::text::Nearest;
using strata::text::nearest;

TEST_CASE("edit_distance counts edits, a swap of neighbours as one", "[base][text]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("", "ab") == 2);
  CHECK(edit_distance("STRATA_LOG", "STRATA_LOG") == 0);
  CHECK(edit_distance("STRATA_LGO", "STRATA_LOG") == 1);  // a swap
  CHECK(edit_distance("size", "sise") == 1);              // a substitution
  CHECK(edit_distance("size", "sze") == 1);               // a deletion
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("ab", "ba") == edit_distance("ba", "ab"));
}

TEST_CASE("nearest: the closest candidate, the first of equals, none when empty", "[base][text]") {
  const std::vector<std::string> flags = {"size", "seconds", "sizes"};
  Nearest n = nearest("sise", flags);
  CHECK(n.name == "size");
  CHECK(n.distance == 1);
  n = nearest("sizes", flags);
  CHECK(n.name == "sizes");
  CHECK(n.distance == 0);
  const std::vector<std::string_view> none;
  n = nearest("x", none);
  CHECK(n.name.empty());
  CHECK(n.distance == std::numeric_limits<size_t>::max());
  const char* const ties[] = {"ab", "ac"};
  CHECK(nearest("aa", ties).name == "ab");
}
