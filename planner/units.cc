#include "planner/units.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::planner {

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::fabs(b) < 1024) return absl::StrCat(bytes, " B");
  if (std::fabs(b) < 1024.0 * 1024) return absl::StrFormat("%.2f KiB", b / 1024);
  if (std::fabs(b) < 1024.0 * 1024 * 1024) return absl::StrFormat("%.2f MiB", b / (1024.0 * 1024));
  return absl::StrFormat("%.2f GiB", b / (1024.0 * 1024 * 1024));
}

std::string FormatSeconds(double seconds) {
  const double s = std::fabs(seconds);
  if (s < 1e-3) return absl::StrFormat("%.0f us", seconds * 1e6);
  if (s < 1.0) return absl::StrFormat("%.3f ms", seconds * 1e3);
  return absl::StrFormat("%.3f s", seconds);
}

}  // namespace tandem::planner
