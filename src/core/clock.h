// Clocks: a monotonic one for durations and deadlines, the wall clock for
// timestamps clients see (OpenAI's `created`).
#pragma once

#include <chrono>
#include <cstdint>

namespace tandem {

inline double monotonic_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

inline int64_t unix_seconds() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace tandem
