// The coherence gate's output: one line per case and a summary for people,
// or one JSON document for machines.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coherence/evaluate.h"

namespace tandem::coherence {

struct RunInfo {
  std::string set_name, set_source, url, model;
};

// "PASS capital-japan  0.41 s  \"Tokyo\"" or
// "FAIL multiply-17-23  0.52 s  \"392\"  wrong: expected '391'"; the answer is
// shown escaped (\n, \t, \uXXXX for controls) and cut at 120 bytes, followed
// by "(cut at max_tokens)" when the server stopped it there.
std::string case_line(const CaseResult& r);

// "coherence: 5 of 6 passed, 1 failed (set seed, model m, http://...)".
std::string summary_line(const RunInfo& info, const std::vector<CaseResult>& results);

// {"set", "source", "url", "model", "ok", "total", "passed", "failed",
//  "cases": [{"id", "pass", "kind", "reason", "answer", "reasoning",
//  "finish_reason", "http_status", "latency_s"}]}.
nlohmann::json json_report(const RunInfo& info, const std::vector<CaseResult>& results);

// Escaped for one line (see case_line), at most `max_bytes` of the input.
std::string one_line(const std::string& text, size_t max_bytes);

}  // namespace tandem::coherence
