// httplib wiring: routes, the checks every request passes before its handler
// (CORS, method, authentication, content type), JSON errors for what httplib
// itself rejects, and the server's lifecycle.
#include "server/server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <regex>
#include <thread>

#include "core/clock.h"
#include "core/error.h"
#include "server/anthropic_api.h"
#include "server/auth.h"
#include "server/errors.h"
#include "server/responses_api.h"
#include "server/server_state.h"

namespace tandem::server {

namespace {

constexpr int kListenBacklog = 1024;  // capped by net.core.somaxconn

double now_s() {
  return monotonic_seconds();
}

int64_t unix_now() {
  return unix_seconds();
}

// Every route: its pattern (also the metrics label), the methods it answers
// (HEAD is implied by GET), and whether it is open without an API key.
struct Route {
  const char* label;
  std::regex pattern;
  std::vector<std::string> methods;
  bool open;
};

const std::vector<Route>& routes() {
  static const std::vector<Route> table = {
      {"/health", std::regex("/health"), {"GET"}, true},
      {"/metrics", std::regex("/metrics"), {"GET"}, true},
      {"/v1/models", std::regex("/v1/models"), {"GET"}, false},
      {"/v1/models/{id}", std::regex("/v1/models/(.+)"), {"GET"}, false},
      {"/v1/status", std::regex("/v1/status"), {"GET"}, false},
      {"/v1/completions", std::regex("/v1/completions"), {"POST"}, false},
      {"/v1/chat/completions", std::regex("/v1/chat/completions"), {"POST"}, false},
      {"/v1/requests/{id}/cancel", std::regex("/v1/requests/([^/]+)/cancel"), {"POST"}, false},
      {"/v1/messages", std::regex("/v1/messages"), {"POST"}, false},
      {"/v1/messages/count_tokens", std::regex("/v1/messages/count_tokens"), {"POST"}, false},
      {"/v1/responses", std::regex("/v1/responses"), {"POST"}, false},
  };
  return table;
}

const Route* find_route(const std::string& path) {
  for (const Route& r : routes())
    if (std::regex_match(path, r.pattern)) return &r;
  return nullptr;
}

bool allows(const Route& r, const std::string& method) {
  for (const std::string& m : r.methods)
    if (m == method || (m == "GET" && method == "HEAD")) return true;
  return false;
}

std::string join_methods(const Route& r, bool with_options) {
  std::string s;
  for (const std::string& m : r.methods) {
    if (!s.empty()) s += ", ";
    s += m;
  }
  if (with_options) s += ", OPTIONS";
  return s;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "application/json; charset=utf-8" -> "application/json"
std::string media_type(const std::string& content_type) {
  std::string t = content_type.substr(0, content_type.find(';'));
  const size_t a = t.find_first_not_of(" \t"), b = t.find_last_not_of(" \t");
  return a == std::string::npos ? "" : lower(t.substr(a, b - a + 1));
}

void set_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

// Errors in the shape of the API the path belongs to: Anthropic's under
// /v1/messages, OpenAI's elsewhere.
void write_error_for(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  if (req.path.rfind("/v1/messages", 0) != 0) return write_error(res, e);
  res.status = e.status;
  if (e.retry_after_s() > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s()));
  res.set_content(dump_json(anthropic_error_body(e)), "application/json");
}

}  // namespace

std::string ServerState::state_word() const {
  if (draining.load()) return "shutting_down";
  Engine* e = engine.load();
  if (!e) return "loading";
  return e->status().healthy ? "ok" : "unhealthy";
}

struct Server::Impl {
  ServerState s;
  httplib::Server http;
  std::thread listener;
  int bound_port = -1;
  socket_t listen_fd = -1;  // the listening socket, seen in the socket-options callback
  double started = now_s();
  std::mutex lifecycle_mu;
  bool drained = false;

  explicit Impl(ServerOptions o) {
    s.options = std::move(o);
    s.created_unix = unix_now();
  }

  // ---- checks before routing ----

  void apply_cors(const httplib::Request& req, httplib::Response& res) const {
    const auto& origins = s.options.cors_origins;
    const std::string origin = req.get_header_value("Origin");
    if (origins.empty() || origin.empty()) return;
    for (const std::string& o : origins) {
      if (o == "*") {
        res.set_header("Access-Control-Allow-Origin", "*");
      } else if (o == origin) {
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
      } else {
        continue;
      }
      res.set_header("Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
      return;
    }
  }

  httplib::Server::HandlerResponse before_routing(const httplib::Request& req,
                                                  httplib::Response& res) {
    using R = httplib::Server::HandlerResponse;
    apply_cors(req, res);
    const Route* route = find_route(req.path);
    if (!route) return R::Unhandled;  // httplib answers 404; on_error() writes the body
    if (req.method == "OPTIONS" && !s.options.cors_origins.empty()) {
      // CORS preflight: open, no body.
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", join_methods(*route, true));
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, Content-Type, x-api-key" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      return R::Handled;
    }
    if (!allows(*route, req.method)) {
      res.set_header("Allow", join_methods(*route, !s.options.cors_origins.empty()));
      write_error_for(req, res,
                      ApiError(405, "method_not_allowed", "",
                               req.method + " is not allowed on " + req.path + "; use " +
                                   join_methods(*route, false)));
      return R::Handled;
    }
    if (!route->open &&
        !api_key_authorized(s.options.api_key, req.get_header_value("Authorization"),
                            req.get_header_value("x-api-key"))) {
      res.set_header("WWW-Authenticate", "Bearer");
      write_error_for(req, res,
                      ApiError(401, "invalid_api_key", "",
                               "missing or invalid API key: send 'Authorization: Bearer KEY' or "
                               "'x-api-key: KEY'"));
      return R::Handled;
    }
    if (req.method == "POST" && req.has_header("Content-Type")) {
      const std::string type = media_type(req.get_header_value("Content-Type"));
      if (type != "application/json") {
        write_error_for(req, res,
                        ApiError(415, "unsupported_media_type", "",
                                 "Content-Type must be application/json, got '" + type + "'"));
        return R::Handled;
      }
    }
    return R::Unhandled;
  }

  // Errors httplib produces itself (no route, body too large, bad HTTP) get
  // the OpenAI error body too.
  void on_error(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status == 204) return;
    switch (res.status) {
      case 404:
        write_error(res,
                    ApiError(404, "not_found", "", "no route for " + req.method + " " + req.path));
        break;
      case 413:
        write_error_for(req, res,
                        ApiError(413, "request_too_large", "",
                                 "the request body is larger than the server's limit of " +
                                     std::to_string(s.options.max_body_bytes) + " bytes"));
        break;
      case 400:
        write_error_for(req, res, ApiError(400, "invalid_request", "", "malformed HTTP request"));
        break;
      default:
        if (res.status >= 500)
          write_error_for(req, res, internal_error("internal error"));
        else if (res.status != 499)
          write_error_for(
              req, res,
              ApiError(res.status, "http_error", "", "HTTP error " + std::to_string(res.status)));
    }
  }

  void log(const httplib::Request& req, const httplib::Response& res) {
    const Route* route = find_route(req.path);
    s.metrics.count_http(route ? route->label : "other", res.status);
    if (s.options.log_requests)
      std::fprintf(stderr, "%s %s %d%s%s\n", req.method.c_str(), req.path.c_str(), res.status,
                   res.has_header("X-Request-Id") ? " " : "",
                   res.get_header_value("X-Request-Id").c_str());
  }

  // ---- handlers ----

  // Runs a handler; an ApiError becomes its response, anything else a
  // sanitized 500 (the detail goes to the log only).
  template <class F>
  httplib::Server::Handler guarded(F fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        write_error_for(req, res, e);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s %s: %s\n", req.method.c_str(), req.path.c_str(), e.what());
        write_error_for(req, res, internal_error("internal error"));
      }
    };
  }

  json model_json() const {
    json m = {{"id", s.options.served_model_name},
              {"object", "model"},
              {"created", s.created_unix},
              {"owned_by", "tandem"}};
    if (Engine* e = s.engine.load()) m["max_model_len"] = e->max_context();  // extension
    return m;
  }

  void health(const httplib::Request&, httplib::Response& res) {
    const std::string state = s.state_word();
    json j = {{"status", state}};
    if (state == "unhealthy")
      if (Engine* e = s.engine.load()) j["error"] = e->status().last_error;
    if (state != "ok") res.set_header("Retry-After", "1");
    set_json(res, state == "ok" ? 200 : 503, j);
  }

  void status(const httplib::Request&, httplib::Response& res) {
    Engine* e = s.engine.load();
    EngineStatus st;
    if (e) st = e->status();
    json requests = json::array();
    for (const EngineStatus::Request& r : st.requests)
      requests.push_back({{"id", r.id},
                          {"phase", request_phase_name(r.phase)},
                          {"lane", r.lane},
                          {"prompt_tokens", r.prompt_tokens},
                          {"completion_tokens", r.completion_tokens},
                          {"elapsed_s", r.elapsed_s}});
    json j = {{"status", s.state_word()},
              {"model", s.options.served_model_name},
              {"uptime_s", e ? st.uptime_s : now_s() - started},
              {"steps_executed", st.steps_executed},
              {"num_running", st.num_running},
              {"num_waiting", st.num_waiting},
              {"total_requests_processed", st.total_requests_processed},
              {"total_requests_failed", st.total_requests_failed},
              {"total_requests_cancelled", st.total_requests_cancelled},
              {"total_prompt_tokens", st.total_prompt_tokens},
              {"total_completion_tokens", st.total_completion_tokens},
              {"generation_tps", st.generation_tps},
              {"prompt_tps", st.prompt_tps},
              {"kv_blocks_used", st.kv_blocks_used},
              {"kv_blocks_total", st.kv_blocks_total},
              {"kv_blocks_cached", st.kv_blocks_cached},
              {"total_cached_prompt_tokens", st.total_cached_prompt_tokens},
              {"kv_cache_dtype", e ? json(st.kv_cache_dtype) : json(nullptr)},
              {"gemm_precision", e ? json(st.gemm_precision) : json(nullptr)},
              {"text_lane_requests", st.text_lane_requests},
              {"vision_lane_requests", st.vision_lane_requests},
              {"vision_encoder_calls", st.vision_encoder_calls},
              {"images_processed", st.images_processed},
              {"vision_encode_seconds", st.vision_encode_seconds},
              {"images_waiting", st.images_waiting},
              {"vision",
               {{"in_checkpoint", s.vision.in_checkpoint},
                {"loaded", s.vision.loaded},
                {"unavailable",
                 s.vision.unavailable.empty() ? json(nullptr) : json(s.vision.unavailable)},
                {"weight_bytes", s.vision.weight_bytes},
                {"device", s.vision.loaded ? json(s.vision.device) : json(nullptr)}}},
              {"watchdog_fired", st.watchdog_fired},
              {"last_error", st.last_error.empty() ? json(nullptr) : json(st.last_error)},
              {"requests", std::move(requests)}};
    j["device"] = e ? json(st.device) : json(nullptr);  // null while loading
    if (st.has_gpu_memory)
      j["gpu_memory"] = {{"total_bytes", st.gpu_memory_total_bytes},
                         {"free_bytes", st.gpu_memory_free_bytes},
                         {"used_bytes", st.gpu_memory_total_bytes - st.gpu_memory_free_bytes}};
    set_json(res, 200, j);
  }

  void metrics(const httplib::Request&, httplib::Response& res) {
    Engine* e = s.engine.load();
    EngineStatus st;
    if (e) st = e->status();
    res.status = 200;
    res.set_content(
        s.metrics.render(e ? &st : nullptr, s.state_word(), s.options.served_model_name),
        "text/plain; version=0.0.4");
  }

  void cancel(const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const std::vector<std::shared_ptr<RequestHandle>> found = s.registry.find(id);
    if (found.empty())
      throw ApiError(404, "request_not_found", "id", "no request in flight has id '" + id + "'");
    bool was_running = false;
    for (const auto& h : found) {  // a response id of n choices: all of them
      was_running = was_running || !h->finished();
      h->cancel();
    }
    set_json(res, 200, {{"id", id}, {"object", "request.cancel"}, {"cancelled", was_running}});
  }

  void register_routes() {
    http.Get("/health", guarded([this](auto& q, auto& r) { health(q, r); }));
    http.Get("/metrics", guarded([this](auto& q, auto& r) { metrics(q, r); }));
    http.Get("/v1/status", guarded([this](auto& q, auto& r) { status(q, r); }));
    http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& r) {
               set_json(r, 200, {{"object", "list"}, {"data", json::array({model_json()})}});
             }));
    http.Get("/v1/models/(.+)", guarded([this](const httplib::Request& q, httplib::Response& r) {
               if (q.matches[1] != s.options.served_model_name)
                 throw ApiError(404, "model_not_found", "model",
                                "the model '" + std::string(q.matches[1]) + "' does not exist");
               set_json(r, 200, model_json());
             }));
    http.Post("/v1/completions", guarded([this](const httplib::Request& q, httplib::Response& r) {
                handle_generation(s, Endpoint::Completions, q, r);
              }));
    http.Post("/v1/chat/completions",
              guarded([this](const httplib::Request& q, httplib::Response& r) {
                handle_generation(s, Endpoint::Chat, q, r);
              }));
    http.Post("/v1/requests/([^/]+)/cancel", guarded([this](auto& q, auto& r) { cancel(q, r); }));
    http.Post("/v1/messages", guarded([this](const httplib::Request& q, httplib::Response& r) {
                handle_anthropic_messages(s, q, r);
              }));
    http.Post("/v1/messages/count_tokens",
              guarded([this](const httplib::Request& q, httplib::Response& r) {
                handle_anthropic_count_tokens(s, q, r);
              }));
    http.Post("/v1/responses", guarded([this](const httplib::Request& q, httplib::Response& r) {
                handle_responses(s, q, r);
              }));
  }

  void configure() {
    const int threads = std::max(16, 2 * s.options.max_concurrent + 8);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a
    // second server binds a port in use without an error.
    http.set_socket_options([this](socket_t sock) {
      listen_fd = sock;
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);  // tokens leave at once
    });
    http.set_tcp_nodelay(true);
    http.set_payload_max_length(s.options.max_body_bytes);
    http.set_read_timeout(30, 0);
    http.set_write_timeout(30, 0);
    http.set_pre_routing_handler(
        [this](const httplib::Request& q, httplib::Response& r) { return before_routing(q, r); });
    http.set_error_handler(
        [this](const httplib::Request& q, httplib::Response& r) { on_error(q, r); });
    http.set_exception_handler([this](const httplib::Request& q, httplib::Response& r,
                                      std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "error: %s %s: %s\n", q.method.c_str(), q.path.c_str(), what.c_str());
      write_error_for(q, r, internal_error("internal error"));
    });
    http.set_logger([this](const httplib::Request& q, const httplib::Response& r) { log(q, r); });
    register_routes();
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->configure();
}

Server::~Server() {
  stop();
}

void Server::bind() {
  Impl& m = *impl_;
  const ServerOptions& o = m.s.options;
  errno = 0;
  if (o.port == 0) {
    m.bound_port = m.http.bind_to_any_port(o.host);
  } else if (m.http.bind_to_port(o.host, o.port)) {
    m.bound_port = o.port;
  }
  if (m.bound_port > 0) {
    // httplib listens with a backlog of 5: a burst of clients connecting at
    // once (32 concurrent requests) overflows it and connections are lost.
    // listen() again on the same socket only raises the backlog.
    if (m.listen_fd >= 0) ::listen(m.listen_fd, kListenBacklog);
    return;
  }
  const int err = errno;
  const std::string where = o.host + ":" + std::to_string(o.port);
  if (err == EADDRINUSE)
    fail(
        "cannot listen on %s: the address is already in use (is another server running? choose "
        "another --port)",
        where.c_str());
  if (err == EACCES)
    fail("cannot listen on %s: permission denied (ports below 1024 need privileges)",
         where.c_str());
  fail("cannot listen on %s: %s", where.c_str(),
       err ? std::strerror(err) : "the host is not a local address or cannot be resolved");
}

int Server::port() const {
  return impl_->bound_port;
}

std::string Server::url() const {
  const std::string& host = impl_->s.options.host;
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port());
}

void Server::start() {
  Impl& m = *impl_;
  if (m.bound_port <= 0) fail("Server::start() before a successful bind()");
  m.listener = std::thread([&m] { m.http.listen_after_bind(); });
  // stop() is a no-op until httplib reports running; wait for it so that a
  // quick stop() cannot leave the listener running forever.
  for (int i = 0; i < 500 && !m.http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void Server::attach(Engine* engine, PromptBuilder* builder, VisionInfo vision) {
  impl_->s.vision = std::move(vision);
  impl_->s.builder.store(builder);
  impl_->s.engine.store(engine);
}

void Server::drain(double grace_s) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.lifecycle_mu);
    if (m.drained) return;
    m.drained = true;
  }
  m.s.draining.store(true);
  if (Engine* e = m.s.engine.load()) e->shutdown(grace_s);
  // Every request is terminal now; let the responses finish writing.
  auto wait_idle = [&](double limit_s) {
    const double until = now_s() + limit_s;
    while (m.s.in_flight.load() > 0 && now_s() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  wait_idle(5.0);
  m.s.hard_stop.store(true);
  wait_idle(2.0);
  stop();
}

void Server::stop() {
  Impl& m = *impl_;
  m.s.hard_stop.store(true);
  m.http.stop();
  if (m.listener.joinable()) m.listener.join();
}

}  // namespace tandem::server
