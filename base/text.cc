// The out-of-line string helpers of text.h.
#include "strata/base/text.h"

#include <absl/strings/str_format.h>

namespace strata::text {

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  out.reserve(text.size() + 2);
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;  // UTF-8 passes through
        }
    }
  }
  return out + "\"";
}

}  // namespace strata::text
