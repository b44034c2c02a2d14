// Byte counts for people: "512 B", "1.50 GiB". In the lowest layer so every layer's error
// messages say sizes the same way.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

std::string format_bytes(uint64_t bytes);

}  // namespace strata
