// Fault injection for reliability tests: compiled in, inert unless the
// environment variable TANDEM_FAULT is set at engine start.
//
// TANDEM_FAULT = comma-separated KIND@N items:
//   step-throw@N   the N-th forward step (1-based) throws
//   step-stall@N   the N-th step blocks until the watchdog has fired (or shutdown)
//   nan-logits@N   the N-th step yields NaN logits
//   kv-exhaust@N   the N-th request's first KV allocation fails (it must wait)
//   vision-throw@N the N-th image given to the vision encoder throws (only its
//                  request fails)
//   cache-drop@N   the prefix cache forgets every cached block just before the
//                  N-th request first takes its prefix (after the vision lane
//                  looked: its skipped images must be encoded after all)
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct FaultPlan {
  uint64_t step_throw = 0;  // 0 = off
  uint64_t step_stall = 0;
  uint64_t nan_logits = 0;
  uint64_t kv_exhaust = 0;
  uint64_t vision_throw = 0;
  uint64_t cache_drop = 0;

  bool any() const {
    return step_throw || step_stall || nan_logits || kv_exhaust || vision_throw || cache_drop;
  }
  // Parses the TANDEM_FAULT syntax; throws Error naming a bad item.
  static FaultPlan parse(const std::string& spec);
  static FaultPlan from_env();
};

}  // namespace tandem
