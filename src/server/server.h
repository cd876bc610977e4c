// The OpenAI-compatible HTTP server (cpp-httplib) in front of one Engine.
//
// Lifecycle:
//   Server s(options);
//   s.bind();          // throws tandem::Error: port in use, bad host
//   s.start();         // serves from a background thread; until attach(),
//                      // /health and the API answer 503 (model_loading)
//   s.attach(&engine, builder);   // ready
//   ...
//   s.drain(grace);    // SIGTERM: refuse new work (503 shutting_down),
//                      // Engine::shutdown(grace), let every in-flight
//                      // response finish writing, then stop listening
// or s.stop();         // immediate: in-flight requests are cancelled
//
// Never-hang contract of the HTTP side: every generation handler waits on its
// request in short slices, and cancels the request when the client has gone
// (server/connection_probe.h), when a stream write fails, or when the server
// stops; the engine then ends it within one step. Routes, fields and error
// codes: docs/api.md.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "image/fetch.h"
#include "server/prompt_builder.h"

namespace tandem::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0: any free port (see port())
  std::string served_model_name;            // the only `model` accepted (a missing one is too)
  std::string api_key;                      // empty: no authentication
  std::vector<std::string> cors_origins;    // empty: CORS off; "*": any origin
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies: 413
  double max_request_timeout_s = 0;         // clips a request's `timeout` (0: no clip)
  int max_concurrent = 32;                  // sizes the HTTP thread pool
  bool log_requests = false;                // one line per response on stderr
  bool allow_image_urls = false;            // http(s) image URLs (else data: URLs only)
  FetchLimits image_url_limits;             // size, time and redirects of one image fetch
  // --no-thinking: chat templates get enable_thinking=false unless the
  // request sets it (chat_template_kwargs.enable_thinking or enable_thinking).
  bool no_thinking = false;
};

// What the served model can do with images, for /v1/status and for the 400
// an image request gets when images are unavailable.
struct VisionInfo {
  bool in_checkpoint = false;  // config.json has a vision_config
  bool loaded = false;         // the tower is loaded and the engine has it
  std::string unavailable;     // why images are refused, when !loaded
  size_t weight_bytes = 0;     // the checkpoint's vision tensors (loaded, or left unread)
  std::string device;          // where the tower encodes ("cpu", "cuda:N") when loaded
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // stop() if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket (without SO_REUSEPORT, so a port in use is an
  // error rather than a silently shared port). Throws tandem::Error.
  void bind();
  int port() const;
  std::string url() const;  // "http://HOST:PORT"

  void start();

  // `engine` and `builder` must outlive drain()/stop(). `builder` may be null
  // (no tokenizer yet): string prompts and chat are then answered 400.
  void attach(Engine* engine, PromptBuilder* builder, VisionInfo vision = {});

  // Graceful shutdown, bounded: returns within about grace_s + 5 s unless the
  // engine itself is stuck inside a step (the caller guards that case, see
  // cli/cmd_serve.cpp). Idempotent.
  void drain(double grace_s);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server
