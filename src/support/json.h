// JSON string literals, for the JSON Kiln writes (records, bench results, traces).
#pragma once

#include <string>
#include <string_view>

namespace kiln {

// `s` as a JSON string literal, quotes included (control characters escaped;
// bytes from 0x80 passed through, so UTF-8 stays UTF-8).
std::string json_quote(std::string_view s);

}  // namespace kiln
