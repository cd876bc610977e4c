// The coherence gate's HTTP side: probes an OpenAI-compatible server and
// asks it one golden case, every call bounded in time.
//
// Contract: no call blocks longer than its bound (plus ~2 s to tear a
// connection down): a request still running at the deadline is cancelled by
// closing its socket, and a transport that does not let go is abandoned on a
// detached thread that owns everything it touches.
#pragma once

#include <string>

#include "coherence/evaluate.h"
#include "coherence/golden_set.h"

namespace tandem::coherence {

struct ProbeResult {
  enum class Status { Ready, Unreachable, NotReady };
  Status status = Status::Unreachable;
  std::string detail;    // what went wrong, for the message
  std::string model_id;  // the first model of GET /v1/models ("" if none)
};

class Client {
 public:
  // `url`: http://host:port, with or without a trailing /v1. `api_key`: sent
  // as a Bearer token when not empty. `timeout_s`: the bound of ask().
  Client(std::string url, std::string api_key, double timeout_s);

  const std::string& base_url() const { return url_; }

  // GET /health until it answers 200 (or 404: a server without the route),
  // for at most `wait_s`; then GET /v1/models for the model id. Unreachable:
  // no HTTP answer at all on the first try; NotReady: still 503 (or another
  // status) when `wait_s` ran out.
  ProbeResult probe(double wait_s) const;

  // POST /v1/chat/completions for the case: temperature 0, thinking off
  // (chat_template_kwargs.enable_thinking = false), its max_tokens, not
  // streamed; `model` when not empty. Never throws for transport problems.
  Reply ask(const GoldenCase& c, const std::string& model) const;

 private:
  std::string url_;
  std::string api_key_;
  double timeout_s_;
};

}  // namespace tandem::coherence
