#include "runtime/profile/cuda_device.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cuda/blas.h"
#include "runtime/cuda/cuda_accelerator.h"
#include "runtime/cuda/kernels/activation.h"
#include "runtime/cuda/optimizer.h"
#include "runtime/profile/timing_stats.h"

namespace tandem::profile {
namespace {

// A version number of the form major * major_unit + minor * minor_unit + patch
// as "major.minor" (or "major.minor.patch").
std::string DottedVersion(int64_t v, int64_t major_unit, int64_t minor_unit, bool with_patch) {
  std::string s = absl::StrCat(v / major_unit, ".", (v % major_unit) / minor_unit);
  if (with_patch) absl::StrAppend(&s, ".", v % minor_unit);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaProfiledDevice>> CudaProfiledDevice::Create(
    int ordinal, const CudaProfiledDeviceOptions& options) {
  if (ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", ordinal, " is negative"));
  }
  if (options.gemm_size <= 0 || options.copy_bytes <= 0 || options.peak_repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaProfiledDeviceOptions: gemm_size and copy_bytes must be > 0 and peak_repeats >= 1, "
        "got ",
        options.gemm_size, ", ", options.copy_bytes, " and ", options.peak_repeats));
  }
  std::string why;
  const std::vector<cuda::CudaDeviceInfo> devices = cuda::QueryCudaDevices(&why);
  if (devices.empty()) return absl::FailedPreconditionError(why);
  auto found =
      std::find_if(devices.begin(), devices.end(),
                   [ordinal](const cuda::CudaDeviceInfo& d) { return d.ordinal == ordinal; });
  if (found == devices.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist (", devices.size(), " found)"));
  }
  int l2_cache_bytes = 0;
  TANDEM_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaDeviceGetAttribute(&l2_cache_bytes, cudaDevAttrL2CacheSize, ordinal),
                       "cudaDeviceGetAttribute(L2 cache size)"));
  cuda::CudaAcceleratorOptions accelerator_options;
  accelerator_options.allow_tf32 = options.allow_tf32;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaAccelerator> accelerator,
                          cuda::CudaAccelerator::Create(ordinal, 0, accelerator_options));
  return std::unique_ptr<CudaProfiledDevice>(
      new CudaProfiledDevice(*found, l2_cache_bytes, options, std::move(accelerator)));
}

CudaProfiledDevice::CudaProfiledDevice(const cuda::CudaDeviceInfo& info, int64_t l2_cache_bytes,
                                       const CudaProfiledDeviceOptions& options,
                                       std::unique_ptr<cuda::CudaAccelerator> accelerator)
    : ProfiledDevice(accelerator.get()),
      info_(info),
      l2_cache_bytes_(l2_cache_bytes),
      options_(options),
      accelerator_(std::move(accelerator)) {}

CudaProfiledDevice::~CudaProfiledDevice() {
  context()->MakeCurrent().IgnoreError();
  // The probe's events live on the context's stream; the eviction buffer goes
  // back to the allocator before the context waits for the stream and goes.
  probe_.reset();
  eviction_.Reset();
}

tandem::v1::DeviceProfile CudaProfiledDevice::Describe() const {
  tandem::v1::DeviceProfile d;
  d.set_id(id());
  d.set_kind(tandem::v1::DEVICE_KIND_CUDA);
  d.set_name(absl::StrCat(info_.name, " (sm_", info_.compute_major, info_.compute_minor, ", ",
                          info_.multiprocessors, " SMs)"));
  d.set_threads(info_.multiprocessors);
  d.set_memory_bytes(info_.memory_bytes);
  return d;
}

std::map<std::string, std::string> CudaProfiledDevice::Versions() const {
  int runtime = 0, driver = 0, cublas = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  cublasGetVersion(context()->cublas, &cublas);
  // CUDA: 1000 major + 10 minor; cuBLAS (12+) and cuDNN (9+): 10000 major +
  // 100 minor + patch.
  return {{"cuda_runtime", DottedVersion(runtime, 1000, 10, false)},
          {"cuda_driver", DottedVersion(driver, 1000, 10, false)},
          {"cublas", DottedVersion(cublas, 10000, 100, true)},
          {"cudnn", DottedVersion(static_cast<int64_t>(cudnnGetVersion()), 10000, 100, true)},
          {"cuda_tf32", options_.allow_tf32 ? "allowed" : "off"}};
}

std::unique_ptr<Allocator> CudaProfiledDevice::NewAllocator() {
  return std::make_unique<cuda::CudaAllocator>(ordinal());
}

absl::Status CudaProfiledDevice::UpdateSlice(const StepConstants& c, float* params,
                                             const float* grads, float* const* states, int64_t n) {
  TANDEM_RETURN_IF_ERROR(context()->MakeCurrent());
  return cuda::UpdateSlice(context(), c, params, grads, states, n);
}

void CudaProfiledDevice::EvictCaches() {
  const int64_t bytes = 2 * l2_cache_bytes_;
  if (bytes <= 0 || !context()->Check(context()->MakeCurrent())) return;
  if (eviction_.empty()) {
    absl::StatusOr<Buffer> buffer =
        Buffer::Allocate(accelerator_->allocator(), bytes, MemoryCategory::kWorkspace);
    if (!context()->Check(buffer.status())) return;
    eviction_ = std::move(buffer).value();
  }
  // A new value each time, so no write can be elided.
  eviction_generation_ = (eviction_generation_ + 1) % 256;
  context()->Check(cudaMemsetAsync(eviction_.data(), eviction_generation_,
                                   static_cast<size_t>(bytes), context()->stream),
                   "cudaMemsetAsync (cache eviction)");
  context()->Check(cudaStreamSynchronize(context()->stream), "cudaStreamSynchronize");
}

absl::Status CudaProfiledDevice::CopyToDevice(void* device_dst, const void* host_src,
                                              int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(context()->MakeCurrent());
  TANDEM_RETURN_IF_ERROR(cuda::CopyAsync(device_dst, host_src, bytes, context()->stream));
  return cuda::CudaStatus(cudaStreamSynchronize(context()->stream), "cudaStreamSynchronize");
}

absl::Status CudaProfiledDevice::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(context()->MakeCurrent());
  TANDEM_RETURN_IF_ERROR(cuda::CopyAsync(host_dst, device_src, bytes, context()->stream));
  return cuda::CudaStatus(cudaStreamSynchronize(context()->stream), "cudaStreamSynchronize");
}

absl::StatusOr<void*> CudaProfiledDevice::AllocatePinnedHost(int64_t bytes) {
  return pinned_.Allocate(bytes, MemoryCategory::kWorkspace);
}

void CudaProfiledDevice::FreePinnedHost(void* ptr, int64_t bytes) {
  pinned_.Free(ptr, bytes, MemoryCategory::kWorkspace);
}

void CudaProfiledDevice::BeginPhase(int layer, Phase phase, int repetition, bool timed) {
  context()->RecordError(context()->MakeCurrent());
  if (probe_ == nullptr && probe_error_.ok()) {
    absl::StatusOr<std::unique_ptr<GpuPhaseProbe>> probe = GpuPhaseProbe::Create(context()->stream);
    if (probe.ok()) {
      probe_ = std::move(probe).value();
    } else {
      probe_error_ = probe.status();
    }
  }
  if (probe_ != nullptr) probe_->BeginPhase(layer, phase, repetition, timed);
}

void CudaProfiledDevice::EndPhase(int layer, Phase phase, int repetition, bool timed) {
  if (probe_ != nullptr) probe_->EndPhase(layer, phase, repetition, timed);
}

absl::Status CudaProfiledDevice::CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out) {
  // Without events nothing beyond wall time could be measured: say so rather
  // than leave the GPU figures out silently.
  if (!probe_error_.ok()) return probe_error_;
  if (probe_ == nullptr) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(context()->MakeCurrent());
  return probe_->CollectLayer(layer, out);
}

void CudaProfiledDevice::StopProbe() {
  if (probe_ == nullptr) return;
  probe_summary_.Clear();
  probe_->FinishProfile(&probe_summary_);
  probe_.reset();
  probe_stopped_ = true;
}

template <typename F>
absl::StatusOr<double> CudaProfiledDevice::MedianEventSeconds(F issue) {
  const cudaStream_t stream = context()->stream;
  TANDEM_ASSIGN_OR_RETURN(const cuda::CudaEvent start, cuda::CudaEvent::Create(/*timing=*/true));
  TANDEM_ASSIGN_OR_RETURN(const cuda::CudaEvent end, cuda::CudaEvent::Create(/*timing=*/true));
  TANDEM_RETURN_IF_ERROR(issue());
  TANDEM_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  std::vector<double> seconds;
  for (int r = 0; r < options_.peak_repeats; ++r) {
    TANDEM_RETURN_IF_ERROR(start.Record(stream));
    TANDEM_RETURN_IF_ERROR(issue());
    TANDEM_RETURN_IF_ERROR(end.Record(stream));
    TANDEM_RETURN_IF_ERROR(end.Synchronize());
    TANDEM_ASSIGN_OR_RETURN(const double s, cuda::CudaEvent::ElapsedSeconds(start, end));
    seconds.push_back(s);
  }
  return Median(seconds);
}

absl::Status CudaProfiledDevice::MeasurePeaks(tandem::v1::DeviceProfile* out) {
  StopProbe();
  TANDEM_RETURN_IF_ERROR(context()->MakeCurrent());
  const cudaStream_t stream = context()->stream;
  std::unique_ptr<Allocator> allocator = NewAllocator();
  {
    const int64_t n = options_.gemm_size;
    TANDEM_ASSIGN_OR_RETURN(
        const Buffer a, Buffer::Allocate(allocator.get(), n * n * 4, MemoryCategory::kWorkspace));
    TANDEM_ASSIGN_OR_RETURN(
        const Buffer b, Buffer::Allocate(allocator.get(), n * n * 4, MemoryCategory::kWorkspace));
    TANDEM_ASSIGN_OR_RETURN(
        const Buffer c, Buffer::Allocate(allocator.get(), n * n * 4, MemoryCategory::kWorkspace));
    // Random operands: tensor cores draw less power, and may clock higher, on
    // constant ones.
    TANDEM_RETURN_IF_ERROR(
        cuda::CudaStatus(cuda::PhiloxUniforms(a.f32(), n * n, 1, 0, stream), "PhiloxUniforms"));
    TANDEM_RETURN_IF_ERROR(
        cuda::CudaStatus(cuda::PhiloxUniforms(b.f32(), n * n, 1, 1, stream), "PhiloxUniforms"));
    cpu::MatmulShape shape;
    shape.m = shape.n = shape.k = n;
    auto gemm = [&] { return cuda::Matmul(context(), shape, a.f32(), b.f32(), c.f32()); };
    TANDEM_ASSIGN_OR_RETURN(const double seconds, MedianEventSeconds(gemm));
    const double flops = 2.0 * std::pow(static_cast<double>(n), 3);
    out->set_gemm_flops_per_second(flops / std::max(seconds, 1e-12));
    TANDEM_RETURN_IF_ERROR(context()->Synchronize());
  }
  {
    const int64_t bytes = options_.copy_bytes;
    TANDEM_ASSIGN_OR_RETURN(const Buffer from,
                            Buffer::Allocate(allocator.get(), bytes, MemoryCategory::kWorkspace));
    TANDEM_ASSIGN_OR_RETURN(const Buffer to,
                            Buffer::Allocate(allocator.get(), bytes, MemoryCategory::kWorkspace));
    TANDEM_RETURN_IF_ERROR(cuda::CudaStatus(
        cudaMemsetAsync(from.data(), 1, static_cast<size_t>(bytes), stream), "cudaMemsetAsync"));
    auto copy = [&] { return cuda::CopyAsync(to.data(), from.data(), bytes, stream); };
    TANDEM_ASSIGN_OR_RETURN(const double seconds, MedianEventSeconds(copy));
    // Each byte is read once and written once.
    out->set_memory_bandwidth_bytes_per_second(2.0 * static_cast<double>(bytes) /
                                               std::max(seconds, 1e-12));
  }
  peaks_note_ = absl::StrCat("peaks: cuBLAS SGEMM ", options_.gemm_size, "^3 with TF32 ",
                             options_.allow_tf32 ? "allowed" : "off", ", device-to-device copy of ",
                             FormatBytes(options_.copy_bytes),
                             " counting bytes read and written; each the median of ",
                             options_.peak_repeats, " CUDA-event timings");
  return absl::OkStatus();
}

void CudaProfiledDevice::BeforeIteration() {
  StopProbe();
  // The executor's peak on the accelerator is the iteration's: the eviction
  // buffer (twice the L2 cache) is made again at the next EvictCaches.
  context()->MakeCurrent().IgnoreError();
  eviction_.Reset();
}

void CudaProfiledDevice::FinishProfile(tandem::v1::DeviceProfile* out) {
  StopProbe();
  std::vector<std::string> notes;
  if (probe_stopped_) {
    out->set_counter_source(probe_summary_.counter_source());
    out->set_profiler_overhead_seconds(probe_summary_.profiler_overhead_seconds());
    out->set_dropped_records(probe_summary_.dropped_records());
    notes.push_back(probe_summary_.counter_note());
  } else if (!probe_error_.ok()) {
    notes.push_back(absl::StrCat("no GPU phase measurements: ", probe_error_.message()));
  } else {
    notes.push_back("no layer phase ran on this device: no GPU phase measurements");
  }
  notes.push_back(
      absl::StrCat("layers timed with TF32 ",
                   options_.allow_tf32 ? "allowed (the accelerator's default)" : "off"));
  if (!peaks_note_.empty()) notes.push_back(peaks_note_);
  if (context()->scratch_bytes() > 0) {
    notes.push_back(
        absl::StrCat("library scratch (cuDNN algorithms, CUB sorts) outside the "
                     "layers' measured workspace: ",
                     FormatBytes(context()->scratch_bytes()), " at most"));
  }
  out->set_counter_note(absl::StrJoin(notes, "; "));
  // The next profile on this device starts afresh.
  probe_stopped_ = false;
  probe_error_ = absl::OkStatus();
  probe_summary_.Clear();
  peaks_note_.clear();
}

}  // namespace tandem::profile
