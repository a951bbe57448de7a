// A Profile as text for people: `tandem profile FILE` prints it. Per device a
// header (name, GEMM and triad rates, iteration peak, the counter source and
// its note, CUPTI overhead and drops), a per-layer time table (median and
// spread of forward, backward and update, achieved FLOP/s), a per-layer counter
// table, the per-layer memory table (analytic, and the measured figure where
// it differs, with the reasons we know of), and the host links. A figure that
// was not measured prints as "-", never as 0. Stateless; thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_PROFILE_REPORT_H_
#define TANDEM_RUNTIME_PROFILE_PROFILE_REPORT_H_

#include <string>

#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

struct ReportOptions {
  // Printed in the header: the profile came from the cache.
  bool cached = false;
};

std::string FormatProfileReport(const tandem::v1::Profile& profile,
                                const ReportOptions& options = {});

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_PROFILE_REPORT_H_
