// A string as a JSON string literal, quotes included: `"`, `\` and control
// characters escaped (RFC 8259), other bytes (UTF-8 included) copied as they are.
// For the few places that write JSON by hand (Chrome traces, YAML -> JSON).
#ifndef TANDEM_BASE_JSON_QUOTE_H_
#define TANDEM_BASE_JSON_QUOTE_H_

#include <string>
#include <string_view>

namespace tandem {

std::string JsonQuote(std::string_view s);

}  // namespace tandem

#endif  // TANDEM_BASE_JSON_QUOTE_H_
