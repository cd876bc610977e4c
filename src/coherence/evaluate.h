// One golden case's verdict from the server's reply (no I/O).
#pragma once

#include <string>

#include "coherence/golden_set.h"

namespace tandem::coherence {

// What one POST /v1/chat/completions gave (client.h fills it).
struct Reply {
  enum class Status {
    Ok,           // HTTP 200 with a chat completion
    Timeout,      // no complete answer within --timeout
    Unreachable,  // no HTTP response (connection refused, reset, ...)
    HttpError,    // a status other than 200
    BadResponse,  // 200 but not a chat completion
  };
  Status status = Status::Unreachable;
  int http_status = 0;
  std::string error;  // the transport or server message when not Ok
  std::string content;
  std::string reasoning;  // reasoning_content, when the server separated some
  std::string finish_reason;
  double latency_s = 0;
};

struct CaseResult {
  std::string id;
  bool pass = false;
  // "pass", "timeout", "unreachable", "http_error", "bad_response",
  // "thinking_leak", "garbage", "rejected", "missing", "wrong".
  std::string kind;
  std::string reason;  // why it failed ("" on a pass)
  Reply reply;
};

// Failure order: transport (status not Ok), a reasoning marker in the content
// (answer_match.h), garbage (garbage_detector.h, with the accepted answers'
// scripts expected), a `reject` substring, a missing `contains` substring,
// then no accepted answer matching. A case passes when none applies.
CaseResult evaluate_case(const GoldenCase& c, const Reply& reply);

}  // namespace tandem::coherence
