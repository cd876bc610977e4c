// The never-hang invariants through the real HTTP path, each with a
// wall-clock bound and followed by a normal request: faults inside steps
// (TANDEM_FAULT), the watchdog, deadlines, capacity, client disconnects,
// cancellation, SIGTERM draining, a port in use — and batching that never
// changes results.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

std::vector<int32_t> prompt_of(int i, int len) {
  std::vector<int32_t> p;
  for (int j = 0; j < len; ++j) p.push_back(3 + (i * 37 + j * 11) % 300);
  return p;
}

std::vector<int32_t> ids_of(const HttpResult& r) {
  return r.body["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

// A normal request succeeds: the server is serving again.
void expect_serving(int port) {
  HttpResult r = post_json(port, "/v1/completions", completion_body({4, 5, 6}, 3));
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(http_get(port, "/health").status, 200);
}

json status_of(int port) {
  return http_get(port, "/v1/status").body;
}

LiveServerConfig slow_config() {
  LiveServerConfig c;
  c.model_dir = slow_model_dir();
  c.engine.max_concurrent = 4;  // keeps the KV cache (and its allocation time) small
  return c;
}

TEST(ServerReliability, ThirtyTwoConcurrentGreedyRequestsEqualTheirSoloOutput) {
  LiveServerConfig c;
  c.engine.max_concurrent = 32;
  c.engine.step_token_budget = 64;  // chunked prefill mixed with decode
  LiveServer srv(c);
  std::vector<std::vector<int32_t>> solo(32);
  for (int i = 0; i < 32; ++i) {
    HttpResult r =
        post_json(srv.port(), "/v1/completions", completion_body(prompt_of(i, 5 + i * 3), 12));
    ASSERT_EQ(r.status, 200) << r.raw;
    solo[size_t(i)] = ids_of(r);
  }
  // The engine counts a finished request against --max-concurrent until its
  // next loop iteration; start the burst from an idle engine.
  ASSERT_TRUE(wait_until(
      [&] {
        EngineStatus st = srv.engine().status();
        return st.num_running == 0 && st.num_waiting == 0;
      },
      2.0));
  std::vector<std::vector<int32_t>> together(32);
  std::vector<std::string> failures(32);
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i)
    threads.emplace_back([&, i] {
      const json body = completion_body(prompt_of(i, 5 + i * 3), 12, /*stream=*/i % 2 == 1);
      if (i % 2 == 1) {
        SseResult s = post_stream(srv.port(), "/v1/completions", body);
        together[size_t(i)] = s.ids();
        if (s.status != 200) failures[size_t(i)] = std::to_string(s.status) + " " + s.raw;
      } else {
        HttpResult r = post_json(srv.port(), "/v1/completions", body);
        if (r.status == 200)
          together[size_t(i)] = ids_of(r);
        else
          failures[size_t(i)] = std::to_string(r.status) + " " + r.raw;
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(together[size_t(i)], solo[size_t(i)])
        << "request " << i << ": " << failures[size_t(i)];
  EXPECT_EQ(srv.engine().status().kv_blocks_used, 0);
}

TEST(ServerReliability, ExceptionInAStepFailsItsRequestsWith500ThenServes) {
  LiveServerConfig c;
  c.fault = "step-throw@1";
  LiveServer srv(c);
  const double t0 = now_s();
  HttpResult r = post_json(srv.port(), "/v1/completions", completion_body({1, 2, 3}, 8));
  EXPECT_LT(now_s() - t0, 5.0);
  EXPECT_EQ(r.status, 500) << r.raw;
  EXPECT_EQ(r.body["error"]["type"], "server_error");
  EXPECT_EQ(r.body["error"]["code"], "internal_error");
  EXPECT_EQ(r.body["error"]["message"], "internal error while running the model");  // sanitized
  expect_serving(srv.port());
  json st = status_of(srv.port());
  EXPECT_EQ(st["total_requests_failed"], 1);
  EXPECT_EQ(st["last_error"], "internal error while running the model");
}

TEST(ServerReliability, ExceptionMidStreamEndsTheStreamWithAnErrorEvent) {
  LiveServerConfig c;
  c.fault = "step-throw@3";  // steps 1 and 2 each produce a token
  LiveServer srv(c);
  json body = completion_body({1, 2, 3}, 8, true);
  body["stream_options"] = {{"include_usage", true}};
  const double t0 = now_s();
  SseResult s = post_stream(srv.port(), "/v1/completions", body);
  EXPECT_LT(now_s() - t0, 5.0);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(s.done) << s.raw;
  EXPECT_EQ(s.ids().size(), 2u);
  EXPECT_EQ(s.finish_reason(), "error");
  ASSERT_GE(s.events.size(), 2u);
  const json& err = s.events.back();
  ASSERT_TRUE(err.contains("error")) << s.raw;
  EXPECT_EQ(err["error"]["code"], "internal_error");
  EXPECT_EQ(s.events[s.events.size() - 2]["usage"]["completion_tokens"], 2);
  expect_serving(srv.port());
}

TEST(ServerReliability, WatchdogFailsAStalledStepThenServes) {
  LiveServerConfig c;
  c.engine.step_timeout_s = 0.3;
  c.fault = "step-stall@1";
  LiveServer srv(c);
  const double t0 = now_s();
  HttpResult r = post_json(srv.port(), "/v1/completions", completion_body({1, 2, 3}, 8));
  EXPECT_LT(now_s() - t0, 3.0);
  EXPECT_EQ(r.status, 500) << r.raw;
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("watchdog"), std::string::npos);
  json st = status_of(srv.port());
  EXPECT_EQ(st["watchdog_fired"], true);
  EXPECT_NE(st["last_error"].get<std::string>().find("watchdog"), std::string::npos);
  EXPECT_TRUE(wait_until([&] { return http_get(srv.port(), "/health").status == 200; }, 3.0));
  expect_serving(srv.port());
}

TEST(ServerReliability, NanLogitsFailTheRequestThenServes) {
  LiveServerConfig c;
  c.fault = "nan-logits@1";
  LiveServer srv(c);
  const double t0 = now_s();
  HttpResult r = post_json(srv.port(), "/v1/completions", completion_body({1, 2, 3}, 8));
  EXPECT_LT(now_s() - t0, 5.0);
  EXPECT_EQ(r.status, 500) << r.raw;
  EXPECT_EQ(r.body["error"]["message"], "the model produced NaN logits");
  expect_serving(srv.port());
}

TEST(ServerReliability, KvExhaustionMakesTheRequestWaitNotFail) {
  LiveServer plain;
  HttpResult solo = post_json(plain.port(), "/v1/completions", completion_body(prompt_of(1, 8), 6));
  ASSERT_EQ(solo.status, 200);
  LiveServerConfig c;
  c.fault = "kv-exhaust@1";
  LiveServer srv(c);
  const double t0 = now_s();
  HttpResult r = post_json(srv.port(), "/v1/completions", completion_body(prompt_of(1, 8), 6));
  EXPECT_LT(now_s() - t0, 5.0);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(ids_of(r), ids_of(solo));
  expect_serving(srv.port());
}

TEST(ServerReliability, DeadlinesAnswer504OrEndTheStream) {
  LiveServer srv(slow_config());
  json body = completion_body({1, 2, 3}, 1500);
  body["timeout"] = 1e-6;
  HttpResult r = post_json(srv.port(), "/v1/completions", body);
  EXPECT_EQ(r.status, 504) << r.raw;
  EXPECT_EQ(r.body["error"]["code"], "timeout");
  body["stream"] = true;  // fails before its first token: a real status too
  EXPECT_EQ(post_stream(srv.port(), "/v1/completions", body).status, 504);

  body["timeout"] = 0.3;  // fails mid-stream
  const double t0 = now_s();
  SseResult s = post_stream(srv.port(), "/v1/completions", body);
  EXPECT_LT(now_s() - t0, 2.0);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(s.done);
  EXPECT_GT(s.ids().size(), 0u);
  EXPECT_LT(s.ids().size(), 1500u);
  EXPECT_EQ(s.finish_reason(), "error");
  EXPECT_EQ(s.events.back()["error"]["code"], "timeout");
  expect_serving(srv.port());
}

// Opens a stream on a raw socket and returns once its first chunk arrived.
int open_stream_socket(int port, const json& body) {
  int fd = connect_local(port);
  const std::string req = http_request_text("POST", "/v1/completions", body.dump());
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  const double until = now_s() + 10.0;
  while (got.find("data: ") == std::string::npos && now_s() < until) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  EXPECT_NE(got.find("data: "), std::string::npos) << got;
  return fd;
}

TEST(ServerReliability, OverCapacityAnswers503WithRetryAfter) {
  LiveServerConfig c = slow_config();
  c.engine.max_concurrent = 2;
  LiveServer srv(c);
  const json long_body = completion_body({1, 2, 3}, 1500, true);
  int a = open_stream_socket(srv.port(), long_body);
  int b = open_stream_socket(srv.port(), long_body);
  HttpResult r = post_json(srv.port(), "/v1/completions", completion_body({1, 2}, 2));
  EXPECT_EQ(r.status, 503) << r.raw;
  EXPECT_EQ(r.body["error"]["code"], "server_overloaded");
  EXPECT_NE(r.headers.find("Retry-After"), r.headers.end());
  close(a);
  close(b);
  EXPECT_TRUE(
      wait_until([&] { return status_of(srv.port())["total_requests_cancelled"] == 2; }, 2.0));
  expect_serving(srv.port());
}

TEST(ServerReliability, ClientDisconnectCancelsAStreamWithinASecond) {
  LiveServer srv(slow_config());
  int fd = open_stream_socket(srv.port(), completion_body({1, 2, 3}, 1500, true));
  // The engine publishes its status once per loop: wait for it to show the
  // request decoding.
  json st;
  EXPECT_TRUE(wait_until(
      [&] {
        st = status_of(srv.port());
        return st["requests"].size() == 1 && st["requests"][0]["phase"] == "decode" &&
               st["requests"][0]["completion_tokens"] >= 1;
      },
      2.0))
      << st;
  EXPECT_EQ(st["requests"][0]["lane"], "text");
  const double t0 = now_s();
  close(fd);
  EXPECT_TRUE(
      wait_until([&] { return status_of(srv.port())["total_requests_cancelled"] == 1; }, 1.0));
  EXPECT_LT(now_s() - t0, 1.0);
  st = status_of(srv.port());
  EXPECT_EQ(st["requests"].size(), 0u);
  EXPECT_EQ(st["kv_blocks_used"], 0);
  expect_serving(srv.port());
}

TEST(ServerReliability, ClientDisconnectCancelsANonStreamRequestWithinASecond) {
  LiveServer srv(slow_config());
  int fd = connect_local(srv.port());
  const std::string req =
      http_request_text("POST", "/v1/completions", completion_body({1, 2, 3}, 1500).dump());
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(wait_until(
      [&] {
        json st = status_of(srv.port());
        return st["requests"].size() == 1 && st["requests"][0]["completion_tokens"] > 0;
      },
      5.0));
  const double t0 = now_s();
  close(fd);
  EXPECT_TRUE(
      wait_until([&] { return status_of(srv.port())["total_requests_cancelled"] == 1; }, 1.0));
  EXPECT_LT(now_s() - t0, 1.0);
  expect_serving(srv.port());
}

TEST(ServerReliability, CancelEndpointEndsAStream) {
  LiveServer srv(slow_config());
  std::string request_id;
  std::atomic<bool> have_id{false};
  SseResult s;
  std::thread reader([&] {
    httplib::Client cli("127.0.0.1", srv.port());
    cli.set_read_timeout(20, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = completion_body({1, 2, 3}, 1500, true).dump();
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& res) {
      request_id = res.get_header_value("X-Request-Id");
      have_id = true;
      return true;
    };
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      s.raw.append(d, n);
      return true;
    };
    cli.send(req);
  });
  ASSERT_TRUE(wait_until([&] { return have_id.load(); }, 10.0));
  const double t0 = now_s();
  HttpResult r = http_post(srv.port(), "/v1/requests/" + request_id + "/cancel", "");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["cancelled"], true);
  reader.join();
  EXPECT_LT(now_s() - t0, 1.0);
  EXPECT_NE(s.raw.find("\"finish_reason\":\"cancelled\""), std::string::npos) << s.raw;
  EXPECT_NE(s.raw.find("data: [DONE]"), std::string::npos);
  // Once its response is complete the id is forgotten (the server may still be
  // releasing the stream when the client has read [DONE]).
  EXPECT_TRUE(wait_until(
      [&] {
        return http_post(srv.port(), "/v1/requests/" + request_id + "/cancel", "").status == 404;
      },
      1.0));
  expect_serving(srv.port());
}

TEST(ServerReliability, SigtermDrainsInFlightRequestsAndExitsZero) {
  ChildServer child({slow_model_dir(), "--threads", "1", "--shutdown-grace", "30"});
  ASSERT_TRUE(child.ready()) << child.log();
  SseResult s;
  std::thread reader([&] {
    s = post_stream(child.port(), "/v1/completions", completion_body({1, 2, 3}, 200, true));
  });
  ASSERT_TRUE(wait_until(
      [&] {
        HttpResult st = http_get(child.port(), "/v1/status");
        return st.status == 200 && st.body["requests"].size() == 1 &&
               st.body["requests"][0]["completion_tokens"] > 0;
      },
      10.0))
      << child.log();
  const double t0 = now_s();
  ASSERT_EQ(kill(child.pid(), SIGTERM), 0);
  // New work is refused while draining (503), or the port is already closed.
  ASSERT_TRUE(wait_until([&] { return http_get(child.port(), "/health").status != 200; }, 2.0));
  HttpResult refused = post_json(child.port(), "/v1/completions", completion_body({1, 2}, 2));
  EXPECT_TRUE(refused.status == 503 || refused.status == -1) << refused.raw;
  reader.join();
  EXPECT_EQ(s.status, 200);
  EXPECT_TRUE(s.done) << s.raw;
  EXPECT_EQ(s.finish_reason(), "length");
  EXPECT_EQ(s.ids().size(), 200u);  // the in-flight request completed
  EXPECT_EQ(child.wait_exit(20.0), 0) << child.log();
  EXPECT_LT(now_s() - t0, 20.0);
  EXPECT_NE(child.log().find("SIGTERM: draining"), std::string::npos) << child.log();
}

TEST(ServerReliability, PortInUseIsAClearErrorAndExitOne) {
  LiveServer srv;
  ChildServer child({fixture_dir("llama-f32"), "--port", std::to_string(srv.port())});
  EXPECT_FALSE(child.ready());
  EXPECT_EQ(child.wait_exit(10.0), 1) << child.log();
  EXPECT_NE(child.log().find("already in use"), std::string::npos) << child.log();
  expect_serving(srv.port());
}

}  // namespace
