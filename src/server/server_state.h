// State shared by the server's route handlers (internal to src/server/).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "server/errors.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/prompt_builder.h"
#include "server/request_registry.h"
#include "server/server.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace tandem::server {

struct ServerState {
  ServerOptions options;
  int64_t created_unix = 0;              // reported as the model's `created`
  std::atomic<Engine*> engine{nullptr};  // null while loading
  std::atomic<PromptBuilder*> builder{nullptr};
  VisionInfo vision;                   // set by attach() before `engine` is published
  std::atomic<bool> draining{false};   // new work gets 503 shutting_down
  std::atomic<bool> hard_stop{false};  // handlers cancel and return
  std::atomic<int> in_flight{0};       // generation responses not yet complete
  Metrics metrics;
  RequestRegistry registry;

  // The /health word: "loading", "ok", "unhealthy", "shutting_down".
  std::string state_word() const;
};

// Counts a generation response as in flight for its whole life (a stream's
// lasts until its content provider is released).
class InFlight {
 public:
  explicit InFlight(ServerState& s) : s_(s) { s_.in_flight++; }
  ~InFlight() { s_.in_flight--; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  ServerState& s_;
};

// POST /v1/completions and /v1/chat/completions (server/generate.cpp).
// Throws ApiError for anything answered before the response starts.
void handle_generation(ServerState& s, Endpoint endpoint, const httplib::Request& req,
                       httplib::Response& res);

// Writes an ApiError as the response (status, JSON body, Retry-After on 503).
void write_error(httplib::Response& res, const ApiError& e);

}  // namespace tandem::server
