// CUPTI's entry points, resolved at run time: libcupti is loaded with dlopen
// and every function Tandem uses is looked up with dlsym into this table, so
// the binary links without CUPTI and runs where it is missing (the profile then
// says CUPTI was unavailable and why). CUDA builds only: the types come from
// the toolkit's CUPTI headers. The loaded table is immutable; thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_CUPTI_CUPTI_API_H_
#define TANDEM_RUNTIME_PROFILE_CUPTI_CUPTI_API_H_

#include <cupti.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::profile {

struct CuptiApi {
  decltype(&::cuptiActivityRegisterCallbacks) ActivityRegisterCallbacks = nullptr;
  decltype(&::cuptiActivityEnable) ActivityEnable = nullptr;
  decltype(&::cuptiActivityDisable) ActivityDisable = nullptr;
  decltype(&::cuptiActivityGetNextRecord) ActivityGetNextRecord = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) ActivityGetNumDroppedRecords = nullptr;
  decltype(&::cuptiActivityFlushAll) ActivityFlushAll = nullptr;
  decltype(&::cuptiActivityPushExternalCorrelationId) ActivityPushExternalCorrelationId = nullptr;
  decltype(&::cuptiActivityPopExternalCorrelationId) ActivityPopExternalCorrelationId = nullptr;
  decltype(&::cuptiGetResultString) GetResultString = nullptr;
  decltype(&::cuptiGetVersion) GetVersion = nullptr;
  // The file that loaded, e.g. "libcupti.so.13".
  std::string library;
};

// Where libcupti is looked for, in order: the loader's search path (soname and
// CUDA 13's versioned name), then the toolkit's usual directories.
const std::vector<std::string>& DefaultCuptiLibraries();

// The first of `candidates` that dlopen loads, with every entry point
// resolved. NOT_FOUND naming each path tried and dlerror's reason when none
// loads; FAILED_PRECONDITION naming the symbol when one is missing.
absl::StatusOr<CuptiApi> LoadCuptiApi(const std::vector<std::string>& candidates);

// The process's table, loaded on first use from DefaultCuptiLibraries(); the
// outcome (a failure too) is kept for the process's lifetime.
absl::StatusOr<const CuptiApi*> GetCuptiApi();

// "cuptiActivityEnable(CONCURRENT_KERNEL): CUPTI_ERROR_NOT_INITIALIZED".
std::string CuptiCallError(const CuptiApi& api, const std::string& call, CUptiResult result);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUPTI_CUPTI_API_H_
