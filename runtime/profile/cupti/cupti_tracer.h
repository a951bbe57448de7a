// CUPTI's Activity API around profiled GPU work: kernels (CONCURRENT_KERNEL),
// copies (MEMCPY), sets (MEMSET), CUPTI's own overhead (OVERHEAD) and the
// correlation of every CUDA call with the external id pushed around the phase
// that made it (EXTERNAL_CORRELATION, which CUPTI emits only in front of an
// API record: RUNTIME and DRIVER are enabled for that). Records go to an
// ActivityRecordSink (activity_attribution.h) as CUPTI completes buffers, and
// on Flush().
//
// Memory is bounded: buffers come from one process-wide ActivityBufferPool
// (sized by the first tracer: `buffers` x `buffer_bytes`); when all are in
// CUPTI's hands the tracer hands it no buffer and CUPTI drops records, which
// dropped_records() counts (CUPTI's own count per context and stream, read as
// each buffer completes) and the profile reports.
//
// CUPTI's callbacks are process-wide, so one tracer may be active at a time
// (Start fails with FAILED_PRECONDITION otherwise). CUDA builds only.
// Push/PopPhase are called from the thread that launches the phase's work;
// Flush and the counters from any thread; the sink is called with a lock held,
// never concurrently, and is read under that lock (WithSinkLocked): CUPTI may
// complete a buffer on its own thread at any time.
#ifndef TANDEM_RUNTIME_PROFILE_CUPTI_CUPTI_TRACER_H_
#define TANDEM_RUNTIME_PROFILE_CUPTI_CUPTI_TRACER_H_

#include <atomic>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "runtime/profile/cupti/activity_attribution.h"
#include "runtime/profile/cupti/activity_buffer_pool.h"
#include "runtime/profile/cupti/cupti_api.h"
#include "runtime/profile/cupti/external_id.h"

namespace tandem::profile {

struct CuptiTracerOptions {
  int buffers = 8;
  size_t buffer_bytes = size_t{4} << 20;
};

class CuptiTracer {
 public:
  // Registers the buffer callbacks and enables the activity kinds. Errors name
  // the CUPTI call and CUPTI's reason (e.g. no driver or no device).
  static absl::StatusOr<std::unique_ptr<CuptiTracer>> Start(const CuptiApi* api,
                                                            ActivityRecordSink* sink,
                                                            CuptiTracerOptions options = {});
  // Flushes, then disables the kinds it enabled.
  ~CuptiTracer();

  absl::Status PushPhase(const PhaseKey& key);
  absl::Status PopPhase();
  // Hands every record CUPTI holds, complete or not, to the sink.
  absl::Status Flush();
  // Runs `read` while no record is being fed to the sink: CUPTI completes full
  // buffers on its own thread, even after a Flush (work of other threads).
  void WithSinkLocked(absl::FunctionRef<void()> read) const;

  int64_t dropped_records() const { return dropped_.load(); }
  // Buffer requests answered with none because the pool was exhausted.
  int64_t refused_buffers() const;
  const CuptiApi& api() const { return *api_; }

 private:
  CuptiTracer(const CuptiApi* api, ActivityRecordSink* sink) : api_(api), sink_(sink) {}
  static void BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records);
  static void BufferCompleted(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t size,
                              size_t valid_size);

  const CuptiApi* const api_;
  ActivityRecordSink* const sink_;
  std::vector<CUpti_ActivityKind> enabled_;
  bool started_ = false;
  std::atomic<int64_t> dropped_{0};
  int64_t refusals_at_start_ = 0;
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUPTI_CUPTI_TRACER_H_
