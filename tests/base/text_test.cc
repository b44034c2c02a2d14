#include "strata/base/text.h"

#include <catch2/catch.hpp>

using strata::text::json_quote;

TEST_CASE("json_quote escapes what JSON requires and passes UTF-8 through", "[base][text]") {
  CHECK(json_quote("") == R"("")");
  CHECK(json_quote("plain") == R"("plain")");
  CHECK(json_quote(R"(a "b" \c)") == R"("a \"b\" \\c")");
  CHECK(json_quote("line\nnext\r\ttab") == R"("line\nnext\r\ttab")");
  CHECK(json_quote(std::string_view("\x01\x1f", 2)) == R"("\u0001\u001f")");
  CHECK(json_quote(std::string_view("nul\0end", 7)) == R"("nul\u0000end")");
  CHECK(json_quote("\x7f") == "\"\x7f\"");  // DEL is allowed as is
  CHECK(json_quote("gr\xc3\xb6\xc3\x9f"
                   "e") ==
        "\"gr\xc3\xb6\xc3\x9f"
        "e\"");  // "größe"
}
