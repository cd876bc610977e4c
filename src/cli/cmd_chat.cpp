// tandem chat: a terminal chat against an OpenAI-compatible server (--url),
// or against a model served in this process on a free loopback port.
//
// Each line read is a user message, answered by a streamed
// /v1/chat/completions request carrying the whole history; commands start
// with '/': /help, /system TEXT, /image PATH, /clear, /exit. Ctrl-C stops
// the reply being streamed (the part shown stays in the history) and
// returns to the prompt; at the prompt it only says how to leave (Ctrl-D
// or /exit). Input that is not a terminal is read the same way, without
// the prompt, so a chat can be scripted.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "catalog/demo_model.h"
#include "catalog/resolve.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/engine.h"
#include "image/image.h"
#include "model/vision_tower.h"
#include "server/model_text.h"
#include "server/server.h"

namespace tandem::cli {

namespace {

using json = nlohmann::json;

std::atomic<bool> g_interrupted{false};

void on_sigint(int) {
  g_interrupted.store(true);
}

// SIGINT to this thread only: a handler without SA_RESTART (so a blocked
// read returns EINTR), and blocked in every thread created while a
// BlockSigint is alive.
void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

class BlockSigint {
 public:
  BlockSigint() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockSigint() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

struct ChatOptions {
  std::string model, url, api_key, system, model_name;
  double temperature = -1;
  int max_tokens = 0;
  int threads = 0;
  std::string device = "auto";
  std::string mmproj;  // --mmproj FILE: the vision tower (llama.cpp mmproj GGUF)
  bool text_only = false;
};

// A model served in this process, for `tandem chat MODEL`.
struct LocalServer {
  std::unique_ptr<Model> model;
  std::unique_ptr<server::ModelText> text;
  std::unique_ptr<VisionTower> tower;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Server> http;

  LocalServer(const std::string& arg, const ChatOptions& o) {
    EngineConfig config;
    config.device = resolve_device(o.device);  // before any download
    const std::string dir = catalog::resolve_model_arg(arg, /*allow_download=*/true);
    model = load_model_verbose(dir, load_options("", config.device));
    model->mmproj = o.mmproj;
    text = server::ModelText::load(dir);
    if (!text || !text->has_chat_template())
      fail("%s has no %s; tandem chat needs one", dir.c_str(),
           text ? "chat template" : "tokenizer (tokenizer.json or tekken.json)");
    server::VisionInfo vision;
    vision.in_checkpoint = VisionTower::present(*model);
    if (!vision.in_checkpoint) {
      vision.unavailable = "the model has no vision tower";
    } else if (o.text_only) {
      vision.unavailable = "tandem chat was started with --text-only";
    } else {
      try {
        tower = VisionTower::load(*model);
        place_vision_tower(*tower, config.device);
        vision.loaded = true;
        vision.device = tower->device_name();
        if (!model->mmproj.empty())
          std::fprintf(stderr, "tandem chat: vision tower loaded from %s\n", model->mmproj.c_str());
      } catch (const Error& e) {
        vision.unavailable = std::string("the vision tower failed to load: ") + e.what();
        std::fprintf(stderr, "warning: %s; text only\n", vision.unavailable.c_str());
      }
    }
    config.threads = o.threads;
    config.max_concurrent = 2;
    BlockSigint block;  // the engine and HTTP threads never take Ctrl-C
    engine = std::make_unique<Engine>(*model, config, text.get(), tower.get());
    server::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.served_model_name = catalog::model_display_name(arg);
    so.max_concurrent = 2;
    http = std::make_unique<server::Server>(so);
    http->bind();
    http->start();
    http->attach(engine.get(), text.get(), vision);
  }
  ~LocalServer() {
    http->stop();
    engine->shutdown(0.0);
  }
};

std::string base64_encode(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v =
        uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    out += {t[v >> 18], t[v >> 12 & 63], t[v >> 6 & 63], t[v & 63]};
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += {t[v >> 18], t[v >> 12 & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8;
    out += {t[v >> 18], t[v >> 12 & 63], t[v >> 6 & 63], '='};
  }
  return out;
}

// The file as a data URL, after checking that it decodes as an image.
std::string image_data_url(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read %s", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  decode_image(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  const char* mime = "image/png";
  if (bytes.rfind("\xff\xd8", 0) == 0) mime = "image/jpeg";
  if (bytes.rfind("GIF8", 0) == 0) mime = "image/gif";
  if (bytes.rfind("BM", 0) == 0) mime = "image/bmp";
  if (bytes.size() > 12 && bytes.compare(8, 4, "WEBP") == 0) mime = "image/webp";
  return std::string("data:") + mime + ";base64," + base64_encode(bytes);
}

// Lines from stdin; a Ctrl-C while waiting is reported, not fatal.
class LineReader {
 public:
  enum class Status { Line, Eof, Interrupted };
  Status next(std::string& line) {
    while (true) {
      if (const size_t nl = buf_.find('\n'); nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Status::Line;
      }
      char chunk[4096];
      const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
      if (n > 0) {
        buf_.append(chunk, size_t(n));
      } else if (n < 0 && errno == EINTR) {
        if (g_interrupted.exchange(false)) return Status::Interrupted;
      } else if (n < 0) {
        return Status::Eof;
      } else {
        if (buf_.empty()) return Status::Eof;
        line.swap(buf_);
        buf_.clear();
        return Status::Line;
      }
    }
  }

 private:
  std::string buf_;
};

class ChatSession {
 public:
  ChatSession(std::string url, const ChatOptions& o) : url_(std::move(url)), o_(o) {
    while (!url_.empty() && url_.back() == '/') url_.pop_back();
    if (url_.size() > 3 && url_.compare(url_.size() - 3, 3, "/v1") == 0)
      url_.resize(url_.size() - 3);
    if (!o.api_key.empty()) headers_.emplace("Authorization", "Bearer " + o.api_key);
    system_ = o.system;
    model_id_ = o.model_name;
    if (model_id_.empty()) discover_model();
  }

  const std::string& model_id() const { return model_id_; }

  // Handles one input line; returns false to leave.
  bool handle(const std::string& line) {
    if (line.empty()) return true;
    if (line[0] == '/') return command(line);
    send(line);
    return true;
  }

 private:
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>(url_);
    c->set_connection_timeout(10, 0);
    c->set_read_timeout(3600, 0);
    c->set_write_timeout(60, 0);
    return c;
  }

  void discover_model() {
    auto c = client();
    c->set_read_timeout(10, 0);
    auto r = c->Get("/v1/models", headers_);
    if (!r) fail("cannot reach %s: %s", url_.c_str(), httplib::to_string(r.error()).c_str());
    if (r->status == 401)
      fail("%s answered 401: pass --api-key (or set TANDEM_API_KEY)", url_.c_str());
    const json j = json::parse(r->body, nullptr, false);
    if (r->status == 200 && !j.is_discarded() && j.contains("data") && j["data"].is_array() &&
        !j["data"].empty() && j["data"][0].contains("id"))
      model_id_ = j["data"][0]["id"].get<std::string>();
  }

  bool command(const std::string& line) {
    const size_t sp = line.find(' ');
    const std::string cmd = line.substr(0, sp);
    std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
    while (!arg.empty() && arg.back() == ' ') arg.pop_back();
    if (cmd == "/exit" || cmd == "/quit") return false;
    if (cmd == "/help") {
      std::printf(
          "  /system TEXT   set the system prompt (no TEXT: remove it)\n"
          "  /image PATH    attach an image to your next message\n"
          "  /clear         forget the conversation (the system prompt stays)\n"
          "  /exit          leave (or Ctrl-D); Ctrl-C stops a reply\n");
    } else if (cmd == "/system") {
      system_ = arg;
      std::printf(arg.empty() ? "(system prompt removed)\n" : "(system prompt set)\n");
    } else if (cmd == "/clear") {
      history_ = json::array();
      images_.clear();
      std::printf("(conversation cleared)\n");
    } else if (cmd == "/image") {
      if (arg.empty()) {
        std::printf("usage: /image PATH\n");
      } else {
        try {
          images_.push_back(image_data_url(arg));
          std::printf("(image %s attached to your next message)\n", arg.c_str());
        } catch (const Error& e) {
          std::printf("error: %s\n", e.what());
        }
      }
    } else {
      std::printf("unknown command %s; /help lists them\n", cmd.c_str());
    }
    std::fflush(stdout);
    return true;
  }

  json request_body() const {
    json messages = json::array();
    if (!system_.empty()) messages.push_back({{"role", "system"}, {"content", system_}});
    for (const json& m : history_) messages.push_back(m);
    json body = {{"messages", messages}, {"stream", true}};
    if (!model_id_.empty()) body["model"] = model_id_;
    if (o_.temperature >= 0) body["temperature"] = o_.temperature;
    if (o_.max_tokens > 0) body["max_tokens"] = o_.max_tokens;
    return body;
  }

  // Streams one reply to stdout. The user's message (and the reply, even a
  // stopped one) join the history unless the request failed.
  void send(const std::string& text) {
    json content = text;
    if (!images_.empty()) {
      content = json::array();
      for (const std::string& url : images_)
        content.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
      content.push_back({{"type", "text"}, {"text", text}});
    }
    history_.push_back({{"role", "user"}, {"content", content}});

    std::string raw, reply, error;
    size_t parsed = 0;
    bool in_reasoning = false;
    auto on_event = [&](const std::string& data) {
      if (data == "[DONE]") return;
      const json j = json::parse(data, nullptr, false);
      if (j.is_discarded()) return;
      if (j.contains("error")) {
        error = j["error"].value("message", j["error"].dump());
        return;
      }
      if (!j.contains("choices") || j["choices"].empty()) return;
      const json& delta = j["choices"][0].value("delta", json::object());
      for (const char* key : {"reasoning_content", "content"}) {
        if (!delta.contains(key) || !delta[key].is_string()) continue;
        const std::string piece = delta[key].get<std::string>();
        const bool reasoning = std::string(key) == "reasoning_content";
        if (reasoning != in_reasoning && isatty(STDOUT_FILENO))
          std::fputs(reasoning ? "\033[2m" : "\033[0m", stdout);
        in_reasoning = reasoning;
        std::fputs(piece.c_str(), stdout);
        if (!reasoning) reply += piece;
      }
      std::fflush(stdout);
    };

    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.headers = headers_;
    req.body = request_body().dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      raw.append(data, n);
      for (size_t end; (end = raw.find("\n\n", parsed)) != std::string::npos; parsed = end + 2) {
        const std::string event = raw.substr(parsed, end - parsed);
        if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
      }
      return !g_interrupted.load();
    };

    auto c = client();
    httplib::Result result{nullptr, httplib::Error::Unknown};
    std::atomic<bool> finished{false};
    std::thread worker;
    {
      BlockSigint block;  // Ctrl-C is the main thread's
      worker = std::thread([&] {
        result = c->send(req);
        finished.store(true);
      });
    }
    bool stopped = false;
    while (!finished.load()) {
      if (g_interrupted.load() && !stopped) {
        stopped = true;
        c->stop();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    worker.join();
    g_interrupted.store(false);
    if (in_reasoning && isatty(STDOUT_FILENO)) std::fputs("\033[0m", stdout);

    if (stopped) {
      std::printf("\n[stopped]\n");
    } else if (!result) {
      error = "cannot reach " + url_ + ": " + httplib::to_string(result.error());
    } else if (result->status != 200) {
      const json j = json::parse(raw.empty() ? result->body : raw, nullptr, false);
      error = strprintf("HTTP %d", result->status);
      if (!j.is_discarded() && j.contains("error") && j["error"].is_object())
        error += ": " + j["error"].value("message", std::string());
    } else {
      std::printf("\n");
    }
    images_.clear();
    if (!error.empty()) {
      std::printf("%serror: %s\n", reply.empty() ? "" : "\n", error.c_str());
      history_.erase(history_.end() - 1);  // the failed turn is forgotten
    } else {
      history_.push_back({{"role", "assistant"}, {"content", reply}});
    }
    std::fflush(stdout);
  }

  std::string url_;
  const ChatOptions& o_;
  httplib::Headers headers_;
  std::string model_id_;
  std::string system_;
  json history_ = json::array();
  std::vector<std::string> images_;  // data URLs for the next message
};

int run_chat(ChatOptions o) {
  if (!o.model.empty() && !o.url.empty())
    fail(
        "give a MODEL to chat with (alias, repo or folder) or --url of a running server, not both");
  if (o.model.empty() && o.url.empty()) {  // nothing given: the built-in demo model
    o.model = catalog::demo_model_dir();
    std::fprintf(stderr, "tandem chat: no model given: chatting with the built-in demo model %s\n",
                 catalog::kDemoModelName);
  }
  if (o.api_key.empty())
    if (const char* env = std::getenv("TANDEM_API_KEY")) o.api_key = env;
  std::unique_ptr<LocalServer> local;
  std::string url = o.url;
  if (!o.model.empty()) {
    local = std::make_unique<LocalServer>(o.model, o);
    url = local->http->url();
  }
  install_sigint_handler();  // after any download and load, which Ctrl-C aborts
  ChatSession session(url, o);
  const bool tty = isatty(STDIN_FILENO);
  if (tty)
    std::printf("chatting with %s at %s; /help for commands, Ctrl-D or /exit to leave\n",
                session.model_id().empty() ? "the server" : session.model_id().c_str(),
                url.c_str());
  LineReader reader;
  std::string line;
  while (true) {
    if (tty) {
      std::printf("> ");
      std::fflush(stdout);
    }
    const auto st = reader.next(line);
    if (st == LineReader::Status::Eof) {
      if (tty) std::printf("\n");  // after the prompt Ctrl-D left on the line
      break;
    }
    if (st == LineReader::Status::Interrupted) {
      std::printf("\n(Ctrl-C stops a reply; Ctrl-D or /exit leaves)\n");
      continue;
    }
    if (!session.handle(line)) break;
  }
  return 0;
}

}  // namespace

Runner add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  auto* cmd = app.add_subcommand("chat", "Chat in the terminal with a model or a running server");
  cmd->add_option("model", o->model,
                  "Alias, org/name[@revision] or folder, served in this process (default: the "
                  "built-in demo model)");
  cmd->add_option("--url", o->url,
                  "A running OpenAI-compatible server, e.g. http://127.0.0.1:8000");
  cmd->add_option("--api-key", o->api_key, "Bearer token for --url (default: $TANDEM_API_KEY)");
  cmd->add_option("--system", o->system, "System prompt");
  cmd->add_option("--model-name", o->model_name,
                  "The `model` field of requests (default: the server's first model)");
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (default: the server's)");
  cmd->add_option("--max-tokens", o->max_tokens, "Longest reply in tokens (default: the server's)");
  cmd->add_option("--threads", o->threads, "CPU threads for an in-process model (default: all)");
  add_device_option(cmd, o->device);
  add_mmproj_option(cmd, o->mmproj);
  cmd->add_flag("--text-only", o->text_only, "Do not load the vision tower of an in-process model");
  return [o] {
    check_mmproj(o->mmproj);
    return run_chat(*o);
  };
}

}  // namespace tandem::cli
