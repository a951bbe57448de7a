// OpenMP teams that leave nothing behind.
//
// libgomp keeps the workers of a thread's last parallel region docked until
// that thread exits, and counts them among the threads it manages. Once those
// outnumber the CPUs, it cuts every team's spin-wait to its short throttled
// count (gomp_throttled_spin_count_var), so each parallel region's start and
// barrier go through futex sleeps and wake-ups. One two-thread region run by
// a long-lived thread (the daemon's node profile on its main thread, an
// evaluation on a job's driving thread) was enough on a 2-core machine to
// make every later compute team up to 1.7x slower (docs/architecture.md,
// "Threads and OpenMP teams"). Parallel work that does not belong to a job's
// compute streams runs here instead.
#ifndef TANDEM_RUNTIME_CORE_OMP_THREADS_H_
#define TANDEM_RUNTIME_CORE_OMP_THREADS_H_

#include "absl/functional/function_ref.h"

namespace tandem {

// Runs `fn` on a new thread whose parallel regions use `threads` threads
// (0 = OpenMP's default) and returns once it has finished. Its workers exit
// with it.
void RunOnOwnOmpThread(int threads, absl::FunctionRef<void()> fn);

// The threads this process has now (/proc/self/task), or -1 where that cannot
// be read: tests check that parallel work left no docked workers behind.
int ProcessThreadCount();

// ProcessThreadCount once it equals `expected`, or what it is after
// `timeout_seconds`: a released team's workers exit shortly after their
// master thread does, not with it.
int ProcessThreadCountOnceAt(int expected, double timeout_seconds = 5);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_OMP_THREADS_H_
