#include "runtime/train/job_model.h"

#include <vector>

#include "base/status_macros.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cuda/device_query.h"

namespace tandem {

using tandem::v1::JobSpec;

int64_t ModelContext(const JobSpec& resolved) {
  if (resolved.model().has_gpt()) {
    return resolved.model().gpt().context() > 0 ? resolved.model().gpt().context()
                                                : kDefaultGptContext;
  }
  if (resolved.model().has_layers()) {
    for (const auto& layer : resolved.model().layers().layers()) {
      if (layer.has_embedding() && layer.embedding().max_positions() > 0) {
        return layer.embedding().max_positions();
      }
    }
    return kDefaultGptContext;
  }
  return 0;
}

LocalCompute LocalComputeFor(const JobSpec& resolved) {
  LocalCompute here{.accelerator = resolved.placement().accelerator(),
                    .onednn_isa = cpu::OneDnnIsa()};
  if (here.accelerator == tandem::v1::ACCELERATOR_KIND_CUDA) {
    const std::vector<cuda::CudaDeviceInfo> gpus = cuda::QueryCudaDevices();
    if (!gpus.empty()) {  // jobs run on cuda:0 (CreateCudaAccelerator)
      here.cuda_capability = gpus[0].compute_major * 10 + gpus[0].compute_minor;
      here.cuda_name = gpus[0].name;
    }
  }
  return here;
}

DType ComputeDType(tandem::v1::Precision precision) {
  return precision == tandem::v1::PRECISION_BF16   ? DType::kBF16
         : precision == tandem::v1::PRECISION_FP16 ? DType::kF16
                                                   : DType::kF32;
}

absl::StatusOr<JobModel> BuildJobModel(const JobSpec& resolved, const PathResolver& resolve,
                                       DType compute) {
  JobModel out;
  TANDEM_ASSIGN_OR_RETURN(out.data,
                          DescribeDatasets(resolved.data(), resolve, ModelContext(resolved)));
  TANDEM_ASSIGN_OR_RETURN(out.model, Model::Build(resolved.model(), out.data, compute));
  return out;
}

}  // namespace tandem
