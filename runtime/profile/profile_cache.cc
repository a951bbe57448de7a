#include "runtime/profile/profile_cache.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/atomic_file.h"
#include "base/status_macros.h"

namespace tandem::profile {
namespace {

uint64_t Fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace

std::string HexKey(const std::string& canonical) {
  return absl::StrFormat("%016x%016x", Fnv1a(canonical, 0xcbf29ce484222325ull),
                         Fnv1a(canonical, 0x84222325cbf29ce4ull));
}

std::string ProfileCache::ProfilePath(const std::string& key) const {
  return absl::StrCat(dir_, "/", key, ".profile.pb");
}

std::string ProfileCache::TracePath(const std::string& key) const {
  return absl::StrCat(dir_, "/", key, ".trace.json");
}

std::optional<tandem::v1::Profile> ProfileCache::Load(const std::string& key) const {
  if (!enabled()) return std::nullopt;
  std::optional<std::string> bytes = ReadWholeFile(ProfilePath(key));
  if (!bytes) return std::nullopt;
  tandem::v1::Profile profile;
  // A file that does not parse, or that another key's profile was written to,
  // is a miss.
  if (!profile.ParseFromString(*bytes) || profile.provenance().cache_key() != key) {
    return std::nullopt;
  }
  return profile;
}

std::optional<std::string> ProfileCache::LoadTrace(const std::string& key) const {
  if (!enabled()) return std::nullopt;
  return ReadWholeFile(TracePath(key));
}

absl::Status ProfileCache::Store(const std::string& key, const tandem::v1::Profile& profile,
                                 const std::string& chrome_trace_json) const {
  if (!enabled()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create profile cache directory '", dir_, "': ", ec.message()));
  }
  if (!chrome_trace_json.empty()) {
    TANDEM_RETURN_IF_ERROR(WriteFileAtomically(TracePath(key), chrome_trace_json));
  }
  // The profile last: its presence is what makes a hit.
  return WriteFileAtomically(ProfilePath(key), profile.SerializeAsString());
}

}  // namespace tandem::profile
