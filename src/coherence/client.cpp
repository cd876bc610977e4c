#include "coherence/client.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace tandem::coherence {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One request on its own thread, cancelled at the deadline. Everything the
// thread uses lives in this shared state, so the thread may outlive the call.
struct Exchange {
  std::unique_ptr<httplib::Client> client;
  httplib::Request request;
  httplib::Result result{nullptr, httplib::Error::Unknown};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

// What send_bounded() got: the exchange's result, or timed_out (and no
// response) when the deadline came first.
struct Outcome {
  bool timed_out = false;
  httplib::Result result{nullptr, httplib::Error::Unknown};
};

// Sends `req` with `timeout_s` as the bound of the whole exchange (connect,
// write, wait, read); at the deadline the socket is closed and the call
// returns within about 2 s more. The socket's own read and write timeouts
// are a backstop 5 s later: set to the bound itself, they raced the deadline
// (both about timeout_s after the send), and under load the read timeout
// sometimes won, so a stalled server read as an unreachable one.
Outcome send_bounded(const std::string& url, httplib::Request req, double timeout_s) {
  auto ex = std::make_shared<Exchange>();
  ex->client = std::make_unique<httplib::Client>(url);
  const auto whole = std::chrono::duration<double>(timeout_s);
  const auto secs = std::chrono::duration_cast<std::chrono::microseconds>(whole);
  const auto connect = std::min(secs, std::chrono::microseconds(10'000'000));
  const auto backstop = secs + std::chrono::microseconds(5'000'000);
  ex->client->set_connection_timeout(connect);
  ex->client->set_read_timeout(backstop);
  ex->client->set_write_timeout(backstop);
  ex->request = std::move(req);
  std::thread([ex] {
    httplib::Result r = ex->client->send(ex->request);
    std::lock_guard<std::mutex> lock(ex->mu);
    ex->result = std::move(r);
    ex->done = true;
    ex->cv.notify_all();
  }).detach();
  Outcome out;
  std::unique_lock<std::mutex> lock(ex->mu);
  if (!ex->cv.wait_for(lock, whole, [&] { return ex->done; })) {
    out.timed_out = true;
    ex->client->stop();  // closes the socket; the thread returns soon after
    ex->cv.wait_for(lock, std::chrono::seconds(2), [&] { return ex->done; });
    return out;  // a thread that did not return is left to finish on its own
  }
  out.result = std::move(ex->result);
  return out;
}

std::string error_message(const httplib::Response& res) {
  const json j = json::parse(res.body, nullptr, false);
  if (!j.is_discarded() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return res.body.substr(0, 200);
}

}  // namespace

Client::Client(std::string url, std::string api_key, double timeout_s)
    : url_(std::move(url)), api_key_(std::move(api_key)), timeout_s_(timeout_s) {
  while (!url_.empty() && url_.back() == '/') url_.pop_back();
  if (url_.size() > 3 && url_.compare(url_.size() - 3, 3, "/v1") == 0) url_.resize(url_.size() - 3);
}

ProbeResult Client::probe(double wait_s) const {
  ProbeResult out;
  httplib::Request req;
  req.method = "GET";
  if (!api_key_.empty()) req.set_header("Authorization", "Bearer " + api_key_);
  const auto t0 = Clock::now();
  for (bool first = true;; first = false) {
    req.path = "/health";
    const double left = std::max(1.0, std::min(10.0, wait_s - seconds_since(t0)));
    Outcome o = send_bounded(url_, req, left);
    if (!o.timed_out && o.result && (o.result->status == 200 || o.result->status == 404)) break;
    if (first && !o.timed_out && !o.result) {
      out.status = ProbeResult::Status::Unreachable;
      out.detail = "cannot reach " + url_ + ": " + httplib::to_string(o.result.error());
      return out;
    }
    if (seconds_since(t0) >= wait_s) {
      out.status = ProbeResult::Status::NotReady;
      out.detail = o.timed_out ? "GET /health did not answer"
                   : o.result  ? "GET /health answered " + std::to_string(o.result->status)
                               : "GET /health: " + httplib::to_string(o.result.error());
      out.detail =
          url_ + " is not ready after " + std::to_string(int(wait_s)) + " s (" + out.detail + ")";
      return out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  out.status = ProbeResult::Status::Ready;
  req.path = "/v1/models";
  Outcome o = send_bounded(url_, req, 10.0);
  if (!o.timed_out && o.result && o.result->status == 200) {
    const json j = json::parse(o.result->body, nullptr, false);
    if (!j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
        j["data"][0].contains("id") && j["data"][0]["id"].is_string())
      out.model_id = j["data"][0]["id"].get<std::string>();
  }
  return out;
}

Reply Client::ask(const GoldenCase& c, const std::string& model) const {
  json body = {{"messages", c.messages},
               {"max_tokens", c.max_tokens},
               {"temperature", 0},
               {"stream", false},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  if (!model.empty()) body["model"] = model;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!api_key_.empty()) req.set_header("Authorization", "Bearer " + api_key_);

  Reply reply;
  const auto t0 = Clock::now();
  Outcome o = send_bounded(url_, std::move(req), timeout_s_);
  reply.latency_s = seconds_since(t0);
  // A socket error at or past the bound is the bound, not a lost server.
  if (o.timed_out || (!o.result && reply.latency_s >= timeout_s_)) {
    reply.status = Reply::Status::Timeout;
    reply.error = "no answer within " + std::to_string(int(timeout_s_)) + " s";
    return reply;
  }
  if (!o.result) {
    reply.status = Reply::Status::Unreachable;
    reply.error = "no response from " + url_ + ": " + httplib::to_string(o.result.error());
    return reply;
  }
  reply.http_status = o.result->status;
  if (o.result->status != 200) {
    reply.status = Reply::Status::HttpError;
    reply.error = error_message(*o.result);
    return reply;
  }
  const json j = json::parse(o.result->body, nullptr, false);
  if (j.is_discarded() || !j.contains("choices") || !j["choices"].is_array() ||
      j["choices"].empty() || !j["choices"][0].contains("message") ||
      !j["choices"][0]["message"].is_object()) {
    reply.status = Reply::Status::BadResponse;
    reply.error = "the 200 response is not a chat completion: " + o.result->body.substr(0, 200);
    return reply;
  }
  const json& choice = j["choices"][0];
  const json& message = choice["message"];
  reply.status = Reply::Status::Ok;
  if (message.contains("content") && message["content"].is_string())
    reply.content = message["content"].get<std::string>();
  if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
    reply.reasoning = message["reasoning_content"].get<std::string>();
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
    reply.finish_reason = choice["finish_reason"].get<std::string>();
  return reply;
}

}  // namespace tandem::coherence
