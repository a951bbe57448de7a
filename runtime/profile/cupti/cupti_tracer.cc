#include "runtime/profile/cupti/cupti_tracer.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tandem::profile {
namespace {

// The active tracer (CUPTI's callbacks carry no user data) and the lock that
// serialises record delivery and start/stop.
absl::Mutex& TracerMutex() {
  static auto* mu = new absl::Mutex();
  return *mu;
}
CuptiTracer* active_tracer ABSL_GUARDED_BY(TracerMutex()) = nullptr;

// Process-wide, never freed: CUPTI may complete a buffer after its tracer is
// gone, and the buffer must still be valid to hand back.
ActivityBufferPool* Pool(const CuptiTracerOptions& options) {
  static auto* pool = new ActivityBufferPool(options.buffers, options.buffer_bytes);
  return pool;
}

// CUPTI emits an EXTERNAL_CORRELATION record only in front of an API record
// (cuptiActivityPushExternalCorrelationId), so without RUNTIME and DRIVER no
// kernel, copy or set could be attributed to a phase. Both: our kernels and
// CUB launch through the runtime, cuBLAS and cuDNN also through the driver.
// The API records themselves are ignored by the sink.
const CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_OVERHEAD,
};

const char* KindName(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_RUNTIME:
      return "RUNTIME";
    case CUPTI_ACTIVITY_KIND_DRIVER:
      return "DRIVER";
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
      return "EXTERNAL_CORRELATION";
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return "CONCURRENT_KERNEL";
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return "MEMCPY";
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return "MEMSET";
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
      return "OVERHEAD";
    default:
      return "?";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CuptiTracer>> CuptiTracer::Start(const CuptiApi* api,
                                                                ActivityRecordSink* sink,
                                                                CuptiTracerOptions options) {
  absl::MutexLock lock(&TracerMutex());
  if (active_tracer != nullptr) {
    return absl::FailedPreconditionError("a CUPTI tracer is already active in this process");
  }
  std::unique_ptr<CuptiTracer> tracer(new CuptiTracer(api, sink));
  tracer->refusals_at_start_ = Pool(options)->refusals();
  CUptiResult r = api->ActivityRegisterCallbacks(&BufferRequested, &BufferCompleted);
  if (r != CUPTI_SUCCESS) {
    return absl::UnavailableError(CuptiCallError(*api, "cuptiActivityRegisterCallbacks", r));
  }
  for (CUpti_ActivityKind kind : kKinds) {
    r = api->ActivityEnable(kind);
    if (r != CUPTI_SUCCESS) {
      for (CUpti_ActivityKind done : tracer->enabled_) api->ActivityDisable(done);
      return absl::UnavailableError(
          CuptiCallError(*api, absl::StrCat("cuptiActivityEnable(", KindName(kind), ")"), r));
    }
    tracer->enabled_.push_back(kind);
  }
  active_tracer = tracer.get();
  tracer->started_ = true;
  return tracer;
}

CuptiTracer::~CuptiTracer() {
  // A tracer that failed to start was destroyed under the lock, with nothing
  // to undo.
  if (!started_) return;
  // Disabled before the last flush: flushing first left what CUPTI recorded
  // afterwards (the flush's own overhead record) in a pool buffer CUPTI kept,
  // to be handed to the next profile's tracer. Still the active tracer, so no
  // other can start meanwhile.
  for (CUpti_ActivityKind kind : enabled_) api_->ActivityDisable(kind);
  (void)Flush();
  absl::MutexLock lock(&TracerMutex());
  if (active_tracer == this) active_tracer = nullptr;
}

void CuptiTracer::WithSinkLocked(absl::FunctionRef<void()> read) const {
  absl::MutexLock lock(&TracerMutex());
  read();
}

absl::Status CuptiTracer::PushPhase(const PhaseKey& key) {
  const CUptiResult r = api_->ActivityPushExternalCorrelationId(
      CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, PackExternalId(key));
  if (r != CUPTI_SUCCESS) {
    return absl::InternalError(CuptiCallError(*api_, "cuptiActivityPushExternalCorrelationId", r));
  }
  return absl::OkStatus();
}

absl::Status CuptiTracer::PopPhase() {
  uint64_t last = 0;
  const CUptiResult r =
      api_->ActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
  if (r != CUPTI_SUCCESS) {
    return absl::InternalError(CuptiCallError(*api_, "cuptiActivityPopExternalCorrelationId", r));
  }
  return absl::OkStatus();
}

absl::Status CuptiTracer::Flush() {
  // Completed buffers come back through BufferCompleted on this thread.
  const CUptiResult r = api_->ActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (r != CUPTI_SUCCESS) {
    return absl::InternalError(CuptiCallError(*api_, "cuptiActivityFlushAll", r));
  }
  return absl::OkStatus();
}

int64_t CuptiTracer::refused_buffers() const {
  return Pool(CuptiTracerOptions())->refusals() - refusals_at_start_;
}

void CuptiTracer::BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  ActivityBufferPool* pool = Pool(CuptiTracerOptions());
  *buffer = pool->Acquire();
  // No buffer: CUPTI drops records until the next request succeeds.
  *size = *buffer != nullptr ? pool->buffer_bytes() : 0;
  *max_records = 0;
}

void CuptiTracer::BufferCompleted(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                                  size_t size, size_t valid_size) {
  ActivityBufferPool* pool = Pool(CuptiTracerOptions());
  {
    absl::MutexLock lock(&TracerMutex());
    CuptiTracer* tracer = active_tracer;
    if (tracer != nullptr && buffer != nullptr) {
      CUpti_Activity* record = nullptr;
      while (tracer->api_->ActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
        tracer->sink_->OnRecord(record);
      }
      size_t dropped = 0;
      if (tracer->api_->ActivityGetNumDroppedRecords(context, stream_id, &dropped) ==
          CUPTI_SUCCESS) {
        tracer->dropped_ += static_cast<int64_t>(dropped);
      }
    }
  }
  pool->Release(buffer);
}

}  // namespace tandem::profile
