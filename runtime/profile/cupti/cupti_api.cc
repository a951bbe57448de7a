#include "runtime/profile/cupti/cupti_api.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::profile {
namespace {

template <typename F>
bool Resolve(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr && missing->empty()) *missing = name;
  return *out != nullptr;
}

}  // namespace

const std::vector<std::string>& DefaultCuptiLibraries() {
  static const auto* paths = new std::vector<std::string>{
      "libcupti.so",
      "libcupti.so.13",
      "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
      "/usr/local/cuda/lib64/libcupti.so",
  };
  return *paths;
}

absl::StatusOr<CuptiApi> LoadCuptiApi(const std::vector<std::string>& candidates) {
  std::vector<std::string> tried;
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried.push_back(absl::StrCat(path, " (", why != nullptr ? why : "not loaded", ")"));
      continue;
    }
    CuptiApi api;
    api.library = path;
    std::string missing;
    Resolve(handle, "cuptiActivityRegisterCallbacks", &api.ActivityRegisterCallbacks, &missing);
    Resolve(handle, "cuptiActivityEnable", &api.ActivityEnable, &missing);
    Resolve(handle, "cuptiActivityDisable", &api.ActivityDisable, &missing);
    Resolve(handle, "cuptiActivityGetNextRecord", &api.ActivityGetNextRecord, &missing);
    Resolve(handle, "cuptiActivityGetNumDroppedRecords", &api.ActivityGetNumDroppedRecords,
            &missing);
    Resolve(handle, "cuptiActivityFlushAll", &api.ActivityFlushAll, &missing);
    Resolve(handle, "cuptiActivityPushExternalCorrelationId",
            &api.ActivityPushExternalCorrelationId, &missing);
    Resolve(handle, "cuptiActivityPopExternalCorrelationId", &api.ActivityPopExternalCorrelationId,
            &missing);
    Resolve(handle, "cuptiGetResultString", &api.GetResultString, &missing);
    Resolve(handle, "cuptiGetVersion", &api.GetVersion, &missing);
    if (!missing.empty()) {
      // The library stays loaded: unloading CUPTI is not supported.
      return absl::FailedPreconditionError(
          absl::StrCat(path, " lacks ", missing, ": not a CUPTI this build can use"));
    }
    return api;
  }
  return absl::NotFoundError(absl::StrCat("CUPTI not found: tried ", absl::StrJoin(tried, "; ")));
}

absl::StatusOr<const CuptiApi*> GetCuptiApi() {
  static const auto* loaded = new absl::StatusOr<CuptiApi>(LoadCuptiApi(DefaultCuptiLibraries()));
  if (!loaded->ok()) return loaded->status();
  return &loaded->value();
}

std::string CuptiCallError(const CuptiApi& api, const std::string& call, CUptiResult result) {
  const char* text = nullptr;
  if (api.GetResultString == nullptr || api.GetResultString(result, &text) != CUPTI_SUCCESS ||
      text == nullptr) {
    return absl::StrCat(call, ": CUPTI error ", static_cast<int>(result));
  }
  return absl::StrCat(call, ": ", text);
}

}  // namespace tandem::profile
