// Helpers for the server tests: an in-process server on an ephemeral port,
// a `tandem serve` child process, HTTP/SSE calls, raw sockets, and a slow
// model for tests that need generation to take a while.
#pragma once

#include <httplib.h>
#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "server/model_text.h"
#include "server/server.h"

namespace tandem::test {

using json = nlohmann::json;

double now_s();

// An in-process server over a fixture model (or any model folder), bound to a
// free port and ready when the constructor returns.
struct LiveServerConfig {
  std::string model_dir;          // default: fixtures/parity/llama-f32
  EngineConfig engine;            // threads default to 1
  server::ServerOptions options;  // port 0 and served name "test-model" by default
  const char* fault = nullptr;    // TANDEM_FAULT while the engine starts
  server::PromptBuilder* builder = nullptr;
  const TextStreamer* streamer = nullptr;  // the engine's detokenizer (none by default)
  bool attach = true;                      // false: the server stays "loading"
};

class LiveServer {
 public:
  explicit LiveServer(LiveServerConfig c = {});
  ~LiveServer();
  int port() const { return server_->port(); }
  Engine& engine() { return *engine_; }
  server::Server& server() { return *server_; }
  const Model& model() const { return *model_; }

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::Server> server_;
};

// An in-process server over a tiny multimodal model with its real chat
// template and tokenizer (default: the Gemma 4 one, vision_model_dir) whose
// every answer is `output` (EngineConfig::forced_output), for tests of what
// the server makes of a model's text.
struct ForcedOutput {
  std::string model_dir;  // default: vision_model_dir("gemma4")
  server::ServerOptions options;
  const char* fault = nullptr;  // TANDEM_FAULT while the engine starts
  double step_timeout_s = 60;
};

class ForcedServer {
 public:
  explicit ForcedServer(const std::string& output, const char* fault = nullptr);
  ForcedServer(const std::string& output, const ForcedOutput& o);
  int port() const { return srv->port(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }

  std::unique_ptr<server::ModelText> text;
  std::unique_ptr<LiveServer> srv;
};

struct HttpResult {
  int status = -1;  // -1: no response (connection error)
  json body;        // parsed when the body is JSON, else null
  std::string raw;
  httplib::Headers headers;
};

HttpResult http_get(int port, const std::string& path, const httplib::Headers& headers = {});
HttpResult http_post(int port, const std::string& path, const std::string& body,
                     const httplib::Headers& headers = {},
                     const std::string& content_type = "application/json");
inline HttpResult post_json(int port, const std::string& path, const json& body,
                            const httplib::Headers& headers = {}) {
  return http_post(port, path, body.dump(), headers);
}

// A server-sent-event stream read to its end.
struct SseResult {
  int status = -1;
  std::vector<json> events;  // every `data:` payload but [DONE]
  bool done = false;         // `data: [DONE]` was the last event
  std::string raw;
  httplib::Headers headers;
  // The generated ids, concatenated from choices[0].token_ids.
  std::vector<int32_t> ids() const;
  // The finish_reason of the stream (the last non-null one), "" if none.
  std::string finish_reason() const;
};
SseResult post_stream(int port, const std::string& path, const json& body,
                      const httplib::Headers& headers = {});

// The records of a stream with named events ("event: NAME\ndata: JSON\n\n",
// Anthropic's and the Responses API's), in order; data that is not JSON
// parses to a discarded value.
struct NamedEvent {
  std::string name;
  json data;
};
std::vector<NamedEvent> named_events(const std::string& raw);

// Raw TCP, for what httplib::Client will not send or do (invalid bytes,
// half-written requests, closing in the middle of a response).
int connect_local(int port);  // -1 on failure
// Sends `request`, reads until the peer closes or `timeout_s` passes.
std::string raw_exchange(int port, const std::string& request, double timeout_s = 5.0);
std::string http_request_text(const std::string& method, const std::string& path,
                              const std::string& body,
                              const std::string& content_type = "application/json");

// Waits until `pred` holds (polling), up to `timeout_s`; returns whether it did.
template <class Pred>
bool wait_until(Pred pred, double timeout_s) {
  const double until = now_s() + timeout_s;
  while (now_s() < until) {
    if (pred()) return true;
    usleep(10000);
  }
  return pred();
}

// `tandem serve ARGS --port 0` as a child process; the constructor returns
// once the ready line is printed (or the child exited).
class ChildServer {
 public:
  ChildServer(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
              double ready_timeout_s = 30.0);
  ~ChildServer();  // SIGKILL if still running
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool ready() const { return port_ > 0; }
  std::string log() const;  // the child's stderr so far
  // Waits for the child to exit; its exit code, or -1 on timeout / signal.
  int wait_exit(double timeout_s);

 private:
  pid_t pid_ = -1;
  int port_ = -1;
  std::string log_path_;
  bool reaped_ = false;
  int exit_code_ = -1;
};

// A llama-architecture checkpoint big enough that decoding takes a few
// milliseconds per token on one thread (written once per test process), so
// tests can act while a request is still generating. Context 2048.
const std::string& slow_model_dir();

// Greedy, ignore_eos completion request body for token-id prompts.
json completion_body(const std::vector<int32_t>& prompt, int max_tokens, bool stream = false);

}  // namespace tandem::test
