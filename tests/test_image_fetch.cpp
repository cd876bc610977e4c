// fetch_url against a local cpp-httplib server on 127.0.0.1: bodies, HTTP
// errors, size and time limits, redirects, refused schemes. Every fetch runs
// with a small timeout, so no test can hang.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/error.h"
#include "image/fetch.h"
#include "test_util.h"

using namespace tandem;

namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The message of the Error that fetch_url throws, or a test failure.
std::string fetch_error(const std::string& url, const FetchLimits& limits) {
  try {
    fetch_url(url, limits);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "fetch_url(" << url << ") did not throw";
  return "";
}

// Limits for tests: small enough that a bug shows up as a failure, not a hang.
FetchLimits test_limits() {
  FetchLimits l;
  l.max_bytes = 64 * 1024;
  l.timeout_s = 5;
  l.max_redirects = 3;
  return l;
}

class ImageFetch : public ::testing::Test {
 protected:
  void SetUp() override {
    png_ = read_file(test::source_dir() + "/tests/fixtures/vision/gemma3/input_0.png");
    ASSERT_GT(png_.size(), 100u);
    const std::string png(png_.begin(), png_.end());

    http_.Get("/image.png", [png](const httplib::Request&, httplib::Response& res) {
      res.set_content(png, "image/png");
    });
    // A body of exactly n bytes, with Content-Length.
    http_.Get(R"(/bytes/(\d+))", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::string(std::stoul(req.matches[1].str()), 'x'), "image/png");
    });
    // An endless chunked body (no Content-Length), bounded at 16 MB.
    http_.Get("/chunked", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("image/png", [](size_t offset, httplib::DataSink& sink) {
        if (offset >= (size_t(16) << 20)) {
          sink.done();
          return true;
        }
        const std::string chunk(4096, 'x');
        return sink.write(chunk.data(), chunk.size());
      });
    });
    // Sleeps up to 5 s before answering; cut short when the test ends.
    http_.Get("/slow", [this](const httplib::Request&, httplib::Response& res) {
      for (int i = 0; i < 500 && !stopping_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      res.set_content("late", "image/png");
    });
    // /redirect/N redirects N times, then serves the PNG.
    http_.Get(R"(/redirect/(\d+))", [](const httplib::Request& req, httplib::Response& res) {
      const int n = std::stoi(req.matches[1].str());
      res.set_redirect(n > 1 ? "/redirect/" + std::to_string(n - 1) : "/image.png");
    });
    http_.Get("/to-file", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("file:///etc/passwd");
    });

    port_ = http_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    listener_ = std::thread([this] { http_.listen_after_bind(); });
    for (int i = 0; i < 500 && !http_.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(http_.is_running());
  }

  void TearDown() override {
    stopping_ = true;
    http_.stop();
    if (listener_.joinable()) listener_.join();
  }

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

  httplib::Server http_;
  std::thread listener_;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
  std::vector<uint8_t> png_;
};

TEST_F(ImageFetch, ReturnsPngByteExact) {
  EXPECT_EQ(fetch_url(url("/image.png"), test_limits()), png_);
}

TEST_F(ImageFetch, ConcurrentFetchesFromSeveralThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  // 4 threads: httplib's listen backlog of 5 would delay a larger burst by 1 s.
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 8; ++i)
        if (fetch_url(url("/image.png"), test_limits()) == png_) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 32);
}

TEST_F(ImageFetch, HttpErrorStatusNamesStatusAndUrl) {
  const std::string msg = fetch_error(url("/missing.png"), test_limits());
  EXPECT_NE(msg.find("HTTP 404"), std::string::npos) << msg;
  EXPECT_NE(msg.find(url("/missing.png")), std::string::npos) << msg;
}

TEST_F(ImageFetch, LongUrlIsTruncatedInMessage) {
  const std::string long_url = url("/missing?q=" + std::string(500, 'a'));
  const std::string msg = fetch_error(long_url, test_limits());
  EXPECT_NE(msg.find("HTTP 404"), std::string::npos) << msg;
  EXPECT_NE(msg.find("..."), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 250u) << msg;
}

TEST_F(ImageFetch, BodyAtLimitIsAccepted) {
  const FetchLimits l = test_limits();
  EXPECT_EQ(fetch_url(url("/bytes/" + std::to_string(l.max_bytes)), l).size(), l.max_bytes);
}

TEST_F(ImageFetch, ContentLengthOverLimitIsRefused) {
  const FetchLimits l = test_limits();
  const std::string msg = fetch_error(url("/bytes/" + std::to_string(l.max_bytes + 1)), l);
  EXPECT_NE(msg.find("larger than the 64 KB limit for image URLs"), std::string::npos) << msg;
}

TEST_F(ImageFetch, ChunkedBodyOverLimitIsRefusedWhileReceiving) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = fetch_error(url("/chunked"), test_limits());
  EXPECT_NE(msg.find("larger than the 64 KB limit for image URLs"), std::string::npos) << msg;
  EXPECT_LT(seconds_since(t0), 2.0);  // aborted early, not after 16 MB
}

TEST_F(ImageFetch, DefaultLimitIsDescribedInMegabytes) {
  FetchLimits l;  // 20 MB
  l.timeout_s = 5;
  const std::string msg = fetch_error(url("/bytes/" + std::to_string(l.max_bytes + 1)), l);
  EXPECT_NE(msg.find("larger than the 20 MB limit for image URLs"), std::string::npos) << msg;
}

TEST_F(ImageFetch, SlowServerTimesOut) {
  FetchLimits l = test_limits();
  l.timeout_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = fetch_error(url("/slow"), l);
  const double elapsed = seconds_since(t0);
  EXPECT_NE(msg.find("timed out after 0.5 s"), std::string::npos) << msg;
  EXPECT_GE(elapsed, 0.4);
  EXPECT_LT(elapsed, 2.0);
}

TEST_F(ImageFetch, RedirectsUpToLimitAreFollowed) {
  EXPECT_EQ(fetch_url(url("/redirect/3"), test_limits()), png_);
}

TEST_F(ImageFetch, TooManyRedirectsAreRefused) {
  const std::string msg = fetch_error(url("/redirect/4"), test_limits());
  EXPECT_NE(msg.find("too many redirects"), std::string::npos) << msg;
  FetchLimits none = test_limits();
  none.max_redirects = 0;
  EXPECT_NE(fetch_error(url("/redirect/1"), none).find("too many redirects"), std::string::npos);
}

TEST_F(ImageFetch, RedirectToFileUrlIsRefused) {
  const std::string msg = fetch_error(url("/to-file"), test_limits());
  EXPECT_NE(msg.find("not http:// or https://"), std::string::npos) << msg;
}

// No fixture server: these fail before or at connecting.
TEST(ImageFetchNoServer, NonHttpSchemesAreRefused) {
  for (const char* u :
       {"file:///etc/passwd", "ftp://x", "gopher://x/", "httpx://x", "/etc/passwd", ""}) {
    const std::string msg = fetch_error(u, test_limits());
    EXPECT_NE(msg.find("is not an http:// or https:// URL"), std::string::npos) << msg;
  }
}

TEST(ImageFetchNoServer, UppercaseSchemeIsAccepted) {
  // Passes the scheme check and fails only at connecting (port 0).
  const std::string msg = fetch_error("HTTP://127.0.0.1:0/x.png", test_limits());
  EXPECT_EQ(msg.find("is not an http"), std::string::npos) << msg;
}

TEST(ImageFetchNoServer, UnreachablePortIsAnError) {
  // A port bound but not listening refuses connections, deterministically.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string u = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/x.png";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = fetch_error(u, test_limits());
  ::close(fd);
  EXPECT_NE(msg.find("cannot fetch image URL '" + u + "'"), std::string::npos) << msg;
  EXPECT_LT(seconds_since(t0), 2.0);
}

TEST(ImageFetchNoServer, UnresolvableHostIsAnError) {
  // .invalid never resolves (RFC 2606); the resolver answers quickly offline.
  const std::string msg = fetch_error("http://no-such-host.invalid/x.png", test_limits());
  EXPECT_NE(msg.find("no-such-host.invalid"), std::string::npos) << msg;
}

}  // namespace
