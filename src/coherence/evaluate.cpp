#include "coherence/evaluate.h"

#include "coherence/answer_match.h"
#include "coherence/garbage_detector.h"
#include "coherence/script.h"
#include "core/error.h"

namespace tandem::coherence {

namespace {

CaseResult failed(CaseResult r, const char* kind, std::string reason) {
  r.pass = false;
  r.kind = kind;
  r.reason = std::move(reason);
  return r;
}

}  // namespace

CaseResult evaluate_case(const GoldenCase& c, const Reply& reply) {
  CaseResult r;
  r.id = c.id;
  r.reply = reply;
  switch (reply.status) {
    case Reply::Status::Ok: break;
    case Reply::Status::Timeout: return failed(r, "timeout", reply.error);
    case Reply::Status::Unreachable: return failed(r, "unreachable", reply.error);
    case Reply::Status::HttpError:
      return failed(r, "http_error",
                    strprintf("HTTP %d: %s", reply.http_status, reply.error.c_str()));
    case Reply::Status::BadResponse: return failed(r, "bad_response", reply.error);
  }
  if (const std::string m = find_reasoning_marker(reply.content); !m.empty())
    return failed(r, "thinking_leak", "reasoning marker " + m + " in the content");
  ScriptSet expected = 0;
  for (const std::string& a : c.accept) expected |= scripts_in(a);
  if (const GarbageVerdict g = detect_garbage(reply.content, expected); g.garbage)
    return failed(r, "garbage", g.reason);
  const std::string folded = fold_case(reply.content);
  for (const std::string& bad : c.reject)
    if (folded.find(fold_case(bad)) != std::string::npos)
      return failed(r, "rejected", "contains rejected text '" + bad + "'");
  for (const std::string& need : c.contains)
    if (folded.find(fold_case(need)) == std::string::npos)
      return failed(r, "missing", "does not contain '" + need + "'");
  if (!c.accept.empty() && !answer_matches(reply.content, c.accept)) {
    std::string list;
    for (const std::string& a : c.accept) list += (list.empty() ? "'" : ", '") + a + "'";
    return failed(r, "wrong", (c.accept.size() > 1 ? "expected one of " : "expected ") + list);
  }
  r.pass = true;
  r.kind = "pass";
  return r;
}

}  // namespace tandem::coherence
