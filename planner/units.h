// Human units for the planner's notes and reports: bytes in B/KiB/MiB/GiB,
// seconds in us/ms/s. Free functions; thread-safe.
#ifndef TANDEM_PLANNER_UNITS_H_
#define TANDEM_PLANNER_UNITS_H_

#include <cstdint>
#include <string>

namespace tandem::planner {

// "812 B", "1.50 MiB", "23.47 GiB".
std::string FormatBytes(int64_t bytes);
// "850 us", "12.345 ms", "1.234 s".
std::string FormatSeconds(double seconds);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_UNITS_H_
