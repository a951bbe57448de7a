// A Schedule as a tandem.v1.Schedule message and back, so a job record can
// keep the step program its plan lowered to (Job.schedule) and the executor
// can run that stored program. FromProto checks every index, so a damaged
// record gives an error naming the field instead of a crash. Free functions;
// thread-safe.
#ifndef TANDEM_SCHEDULE_SCHEDULE_PROTO_H_
#define TANDEM_SCHEDULE_SCHEDULE_PROTO_H_

#include "absl/status/statusor.h"
#include "schedule/schedule.h"
#include "tandem/v1/schedule.pb.h"

namespace tandem::schedule {

tandem::v1::Schedule ToProto(const Schedule& schedule);

// INVALID_ARGUMENT naming the field ("schedule.ops[12].deps[0].op: ...") when
// an index is out of range, an operation is missing from or repeated in its
// resource's order, or an enum is unknown.
absl::StatusOr<Schedule> FromProto(const tandem::v1::Schedule& proto);

// Whether two schedules are the same program: every field equal.
bool SameSchedule(const Schedule& a, const Schedule& b);

}  // namespace tandem::schedule

#endif  // TANDEM_SCHEDULE_SCHEDULE_PROTO_H_
