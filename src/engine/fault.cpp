#include "engine/fault.h"

#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace tandem {

FaultPlan FaultPlan::parse(const std::string& spec) {
  FaultPlan plan;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t at = item.find('@');
    const std::string kind = item.substr(0, at);
    char* end = nullptr;
    const unsigned long long n =
        at == std::string::npos ? 0 : std::strtoull(item.c_str() + at + 1, &end, 10);
    if (at == std::string::npos || n == 0 || *end != '\0')
      fail("TANDEM_FAULT: \"%s\" is not KIND@N with N >= 1", item.c_str());
    if (kind == "step-throw")
      plan.step_throw = n;
    else if (kind == "step-stall")
      plan.step_stall = n;
    else if (kind == "nan-logits")
      plan.nan_logits = n;
    else if (kind == "kv-exhaust")
      plan.kv_exhaust = n;
    else if (kind == "vision-throw")
      plan.vision_throw = n;
    else if (kind == "cache-drop")
      plan.cache_drop = n;
    else
      fail(
          "TANDEM_FAULT: unknown kind \"%s\" (step-throw, step-stall, nan-logits, kv-exhaust, "
          "vision-throw, cache-drop)",
          kind.c_str());
  }
  return plan;
}

FaultPlan FaultPlan::from_env() {
  const char* v = std::getenv("TANDEM_FAULT");
  return v ? parse(v) : FaultPlan{};
}

}  // namespace tandem
