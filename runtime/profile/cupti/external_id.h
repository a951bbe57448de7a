// The ids that tie GPU work to the layer phase that launched it. Around every
// profiled phase the GPU probe pushes a CUPTI external correlation id
// (cuptiActivityPushExternalCorrelationId, kind CUSTOM0) that packs the layer,
// the phase and the repetition; CUPTI then emits an EXTERNAL_CORRELATION record
// mapping each CUDA API call made meanwhile (its correlationId) to that id, and
// kernels, copies and sets carry the correlationId of the call that launched
// them. Header-only value types; thread-safe. Built with or without CUDA.
//
//   bit 63      1 (an id of ours; never 0)
//   bits 40-62  layer + 1 (so -1, the whole-model update, fits)
//   bits 32-39  phase
//   bits 0-31   repetition
#ifndef TANDEM_RUNTIME_PROFILE_CUPTI_EXTERNAL_ID_H_
#define TANDEM_RUNTIME_PROFILE_CUPTI_EXTERNAL_ID_H_

#include <cstdint>
#include <tuple>

#include "runtime/device/timing_sink.h"

namespace tandem::profile {

struct PhaseKey {
  int layer = 0;
  Phase phase = Phase::kForward;
  int repetition = 0;

  friend bool operator<(const PhaseKey& a, const PhaseKey& b) {
    return std::make_tuple(a.layer, a.phase, a.repetition) <
           std::make_tuple(b.layer, b.phase, b.repetition);
  }
  friend bool operator==(const PhaseKey& a, const PhaseKey& b) {
    return a.layer == b.layer && a.phase == b.phase && a.repetition == b.repetition;
  }
};

constexpr uint64_t kExternalIdTag = uint64_t{1} << 63;

inline uint64_t PackExternalId(const PhaseKey& key) {
  return kExternalIdTag | (static_cast<uint64_t>(key.layer + 1) & ((uint64_t{1} << 23) - 1)) << 40 |
         static_cast<uint64_t>(static_cast<uint8_t>(key.phase)) << 32 |
         static_cast<uint32_t>(key.repetition);
}

// False for an id that is not one of ours.
inline bool UnpackExternalId(uint64_t id, PhaseKey* key) {
  if ((id & kExternalIdTag) == 0) return false;
  key->layer = static_cast<int>((id >> 40) & ((uint64_t{1} << 23) - 1)) - 1;
  key->phase = static_cast<Phase>((id >> 32) & 0xff);
  key->repetition = static_cast<int>(static_cast<uint32_t>(id));
  return true;
}

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUPTI_EXTERNAL_ID_H_
