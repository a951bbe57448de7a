// Status propagation helpers, as in Abseil-based codebases: return early on error.
#ifndef TANDEM_BASE_STATUS_MACROS_H_
#define TANDEM_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_STATUS_CONCAT_INNER(a, b) a##b
#define TANDEM_STATUS_CONCAT(a, b) TANDEM_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status); returns it from the caller when not OK.
#define TANDEM_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    const ::absl::Status tandem_status_ = (expr);    \
    if (!tandem_status_.ok()) return tandem_status_; \
  } while (0)

// `lhs = value of expr` for an absl::StatusOr `expr`, or return its status.
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL(TANDEM_STATUS_CONCAT(tandem_statusor_, __LINE__), lhs, expr)

#define TANDEM_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) return statusor.status();           \
  lhs = std::move(statusor).value()

#endif  // TANDEM_BASE_STATUS_MACROS_H_
