#include "test_server_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "model/synth.h"
#include "test_util.h"

namespace tandem::test {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- in-process server ----

LiveServer::LiveServer(LiveServerConfig c) {
  if (c.model_dir.empty()) c.model_dir = fixture_dir("llama-f32");
  if (c.engine.threads == 0) c.engine.threads = 1;
  if (c.options.served_model_name.empty()) c.options.served_model_name = "test-model";
  c.options.port = 0;
  c.options.max_concurrent = c.engine.max_concurrent;
  model_ = load_model(c.model_dir);
  if (c.fault) setenv("TANDEM_FAULT", c.fault, 1);
  engine_ = std::make_unique<Engine>(*model_, c.engine, c.streamer);
  unsetenv("TANDEM_FAULT");
  server_ = std::make_unique<server::Server>(c.options);
  server_->bind();
  server_->start();
  if (c.attach) server_->attach(engine_.get(), c.builder);
}

LiveServer::~LiveServer() {
  server_->stop();
  engine_->shutdown(0.0);
}

// ---- HTTP ----

namespace {

json parse_or_null(const std::string& s) {
  json j = json::parse(s, nullptr, false);
  return j.is_discarded() ? json(nullptr) : j;
}

httplib::Client make_client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  c.set_write_timeout(30, 0);
  c.set_connection_timeout(5, 0);
  return c;
}

HttpResult to_result(const httplib::Result& r) {
  HttpResult out;
  if (!r) {
    out.raw = "connection error: " + httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.raw = r->body;
  out.body = parse_or_null(r->body);
  out.headers = r->headers;
  return out;
}

}  // namespace

ForcedServer::ForcedServer(const std::string& output, const char* fault)
    : ForcedServer(output, [fault] {
        ForcedOutput o;
        o.fault = fault;
        return o;
      }()) {}

ForcedServer::ForcedServer(const std::string& output, const ForcedOutput& o) {
  const std::string dir = o.model_dir.empty() ? vision_model_dir("gemma4") : o.model_dir;
  text = server::ModelText::load(dir);
  LiveServerConfig c;
  c.model_dir = dir;
  c.builder = text.get();
  c.streamer = text.get();
  c.options = o.options;
  c.fault = o.fault;
  c.engine.step_timeout_s = o.step_timeout_s;
  c.engine.forced_output = text->tokenizer().encode(output, /*add_special=*/false);
  srv = std::make_unique<LiveServer>(c);
}

HttpResult http_get(int port, const std::string& path, const httplib::Headers& headers) {
  auto c = make_client(port);
  return to_result(c.Get(path.c_str(), headers));
}

HttpResult http_post(int port, const std::string& path, const std::string& body,
                     const httplib::Headers& headers, const std::string& content_type) {
  auto c = make_client(port);
  return to_result(c.Post(path.c_str(), headers, body, content_type.c_str()));
}

std::vector<int32_t> SseResult::ids() const {
  std::vector<int32_t> ids;
  for (const json& e : events)
    if (e.contains("choices") && !e["choices"].empty() && e["choices"][0].contains("token_ids"))
      for (const json& id : e["choices"][0]["token_ids"]) ids.push_back(id.get<int32_t>());
  return ids;
}

std::string SseResult::finish_reason() const {
  std::string reason;
  for (const json& e : events)
    if (e.contains("choices") && !e["choices"].empty() &&
        e["choices"][0].value("finish_reason", json(nullptr)).is_string())
      reason = e["choices"][0]["finish_reason"].get<std::string>();
  return reason;
}

SseResult post_stream(int port, const std::string& path, const json& body,
                      const httplib::Headers& headers) {
  auto c = make_client(port);
  SseResult out;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.raw.append(data, n);
    return true;
  };
  auto r = c.send(req);
  if (!r) {
    out.raw = "connection error: " + httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.headers = r->headers;
  if (out.raw.empty()) out.raw = r->body;
  size_t pos = 0;
  while (true) {
    const size_t end = out.raw.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string event = out.raw.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    out.done = false;  // [DONE] must be last
    out.events.push_back(parse_or_null(data));
  }
  return out;
}

std::vector<NamedEvent> named_events(const std::string& raw) {
  std::vector<NamedEvent> out;
  size_t pos = 0;
  for (size_t end; (end = raw.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    const std::string rec = raw.substr(pos, end - pos);
    NamedEvent e;
    size_t line = 0;
    while (line < rec.size()) {
      size_t nl = rec.find('\n', line);
      if (nl == std::string::npos) nl = rec.size();
      const std::string l = rec.substr(line, nl - line);
      if (l.rfind("event: ", 0) == 0) e.name = l.substr(7);
      if (l.rfind("data: ", 0) == 0) e.data = json::parse(l.substr(6), nullptr, false);
      line = nl + 1;
    }
    out.push_back(std::move(e));
  }
  return out;
}

// ---- raw sockets ----

int connect_local(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string raw_exchange(int port, const std::string& request, double timeout_s) {
  int fd = connect_local(port);
  if (fd < 0) return "";
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  std::string out;
  const double until = now_s() + timeout_s;
  char buf[4096];
  while (now_s() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
    // Done once a response with a Content-Length is complete.
    const size_t head_end = out.find("\r\n\r\n");
    const size_t cl = out.find("Content-Length: ");
    if (head_end != std::string::npos && cl != std::string::npos && cl < head_end &&
        out.size() >= head_end + 4 + std::stoul(out.substr(cl + 16)))
      break;
  }
  close(fd);
  return out;
}

std::string http_request_text(const std::string& method, const std::string& path,
                              const std::string& body, const std::string& content_type) {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!content_type.empty()) r += "Content-Type: " + content_type + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  return r;
}

// ---- child process ----

ChildServer::ChildServer(const std::vector<std::string>& args, const std::vector<std::string>& env,
                         double ready_timeout_s) {
  char templ[] = "/tmp/tandem-serve-log-XXXXXX";
  int log_fd = mkstemp(templ);
  log_path_ = templ;
  std::vector<std::string> argv = {tandem_binary(), "serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  bool has_port = false;
  for (const auto& a : args) has_port |= a == "--port";
  if (!has_port) {
    argv.push_back("--port");
    argv.push_back("0");
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(log_fd, STDERR_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    for (int fd = 3; fd < 1024; ++fd) close(fd);  // no inherited sockets
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(log_fd);
  const double until = now_s() + ready_timeout_s;
  while (now_s() < until) {
    const std::string text = log();
    if (text.find("tandem serve: ready:") != std::string::npos) {
      const size_t at = text.find("http://127.0.0.1:");
      if (at != std::string::npos) port_ = std::atoi(text.c_str() + at + 17);
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return;
    }
    usleep(20000);
  }
}

ChildServer::~ChildServer() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  unlink(log_path_.c_str());
}

std::string ChildServer::log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int ChildServer::wait_exit(double timeout_s) {
  if (reaped_) return exit_code_;
  const double until = now_s() + timeout_s;
  while (now_s() < until) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return exit_code_;
    }
    usleep(10000);
  }
  return -1;
}

// ---- models and bodies ----

const std::string& slow_model_dir() {
  static TempDir dir;
  static const std::string path = [] {
    std::ifstream f(fixture_dir("llama-f32") + "/config.json");
    json cfg = json::parse(f);
    cfg["hidden_size"] = 256;
    cfg["intermediate_size"] = 1024;
    cfg["num_hidden_layers"] = 6;
    cfg["num_attention_heads"] = 8;
    cfg["num_key_value_heads"] = 4;
    cfg["head_dim"] = 32;
    cfg["max_position_embeddings"] = 2048;
    const std::string config_path = dir.path() + "/config.json";
    std::ofstream(config_path) << cfg.dump(2);
    const std::string out = dir.path() + "/slow-llama";
    synth_checkpoint(config_path, out, DType::F32, 7);
    return out;
  }();
  return path;
}

json completion_body(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  json b = {
      {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  if (stream) b["stream"] = true;
  return b;
}

}  // namespace tandem::test
