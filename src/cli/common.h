// Helpers shared by the CLI commands.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace tandem::cli {

// "1,2, 3" -> {1, 2, 3}; throws Error naming the flag on anything else.
std::vector<int32_t> parse_id_list(const std::string& text, const char* flag);

// Loads a model folder, touching every weight page once (so the first token
// is not slowed by page faults) with a progress line on stderr.
std::unique_ptr<Model> load_model_verbose(const std::string& dir);

// Peak resident memory of this process in bytes (VmHWM), 0 if unknown.
uint64_t peak_rss_bytes();

// Seconds on a monotonic clock.
double now_seconds();

}  // namespace tandem::cli
