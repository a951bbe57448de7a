#include "base/units.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {

std::string FormatBytes(int64_t bytes, int decimals) {
  const double b = static_cast<double>(bytes);
  const double magnitude = std::fabs(b);
  if (magnitude < 1024) return absl::StrCat(bytes, " B");
  if (magnitude < 1024.0 * 1024) return absl::StrFormat("%.*f KiB", decimals, b / 1024);
  if (magnitude < 1024.0 * 1024 * 1024) {
    return absl::StrFormat("%.*f MiB", decimals, b / (1024.0 * 1024));
  }
  return absl::StrFormat("%.*f GiB", decimals, b / (1024.0 * 1024 * 1024));
}

std::string FormatSeconds(double seconds) {
  const double s = std::fabs(seconds);
  if (s < 1e-3) return absl::StrFormat("%.0f us", seconds * 1e6);
  if (s < 1.0) return absl::StrFormat("%.3f ms", seconds * 1e3);
  return absl::StrFormat("%.3f s", seconds);
}

}  // namespace tandem
