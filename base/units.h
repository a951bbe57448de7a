// Human units for messages, notes and reports: bytes in B/KiB/MiB/GiB and
// seconds in us/ms/s. The one formatter of each for every module (planner,
// runtime, node, server). Free functions; thread-safe.
#ifndef TANDEM_BASE_UNITS_H_
#define TANDEM_BASE_UNITS_H_

#include <cstdint>
#include <string>

namespace tandem {

// Binary units with `decimals` digits after the point: "812 B", "1.50 MiB",
// "23.47 GiB" (decimals 2, the default, for reports); error messages about
// allocations use 1 ("2.9 KiB"). Negative sizes keep their sign.
std::string FormatBytes(int64_t bytes, int decimals = 2);

// "850 us", "12.345 ms", "1.234 s".
std::string FormatSeconds(double seconds);

}  // namespace tandem

#endif  // TANDEM_BASE_UNITS_H_
