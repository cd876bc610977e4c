#include "image/fetch.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <mutex>
#include <string_view>

#include "core/error.h"

namespace tandem {

namespace {

// Longest part of a URL quoted in an error message.
constexpr size_t kMaxQuotedUrl = 100;

// The URL as it appears in error messages: at most kMaxQuotedUrl characters
// (then "..."), control characters replaced so the message stays one line.
std::string quote_url(const std::string& url) {
  std::string out = url.substr(0, kMaxQuotedUrl);
  for (char& c : out)
    if (std::iscntrl(static_cast<unsigned char>(c))) c = '?';
  if (url.size() > kMaxQuotedUrl) out += "...";
  return out;
}

// True when the URL starts with http:// or https:// (scheme case-insensitive).
bool is_http_url(std::string_view url) {
  auto starts_with = [&](std::string_view prefix) {
    return url.size() >= prefix.size() &&
           std::equal(prefix.begin(), prefix.end(), url.begin(), [](char a, char b) {
             return a == std::tolower(static_cast<unsigned char>(b));
           });
  };
  return starts_with("http://") || starts_with("https://");
}

// "20 MB", "64 KB" or "1000 bytes".
std::string describe_size(size_t bytes) {
  if (bytes >= (size_t(1) << 20) && bytes % (size_t(1) << 20) == 0)
    return strprintf("%zu MB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return strprintf("%zu KB", bytes >> 10);
  return strprintf("%zu bytes", bytes);
}

// libcurl's global state, set up once for the process (curl_global_init is
// not thread-safe by itself). A failure throws and is retried by the next call.
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) fail("cannot initialise libcurl: %s", curl_easy_strerror(rc));
  });
}

// The body received so far; the write callback refuses to grow it past max.
struct Sink {
  std::vector<uint8_t> body;
  size_t max_bytes = 0;
  bool too_large = false;
};

// CURLOPT_WRITEFUNCTION: appends to the Sink, or returns 0 (which aborts the
// transfer with CURLE_WRITE_ERROR) once the body would exceed max_bytes.
size_t write_body(char* data, size_t size, size_t count, void* user) {
  Sink& sink = *static_cast<Sink*>(user);
  const size_t n = size * count;
  if (n > sink.max_bytes - sink.body.size()) {
    sink.too_large = true;
    return 0;
  }
  sink.body.insert(sink.body.end(), data, data + n);
  return n;
}

struct EasyDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};

}  // namespace

std::vector<uint8_t> fetch_url(const std::string& url, const FetchLimits& limits) {
  const std::string quoted = quote_url(url);
  if (!is_http_url(url)) fail("image URL '%s' is not an http:// or https:// URL", quoted.c_str());

  init_curl_once();
  std::unique_ptr<CURL, EasyDeleter> easy(curl_easy_init());
  if (!easy) fail("cannot fetch image URL '%s': libcurl could not start", quoted.c_str());
  CURL* h = easy.get();

  Sink sink;
  sink.max_bytes = limits.max_bytes;
  char errbuf[CURL_ERROR_SIZE] = "";
  const long timeout_ms = std::max(1L, std::lround(limits.timeout_s * 1000));

  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  // Only http(s), for the first request and for every redirect target.
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, long(std::max(0, limits.max_redirects)));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  // No SIGALRM for DNS timeouts: signals are unsafe with several threads.
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  // A status >= 400 ends the transfer without downloading the error page.
  curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
  // Refuses an announced Content-Length over the limit before the body comes;
  // write_body enforces the limit when no length is announced.
  curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, curl_off_t(limits.max_bytes));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  // Some image hosts refuse requests without a User-Agent.
  curl_easy_setopt(h, CURLOPT_USERAGENT, "tandem");

  const CURLcode rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);

  const char* u = quoted.c_str();
  const std::string too_large =
      "larger than the " + describe_size(limits.max_bytes) + " limit for image URLs";
  if (sink.too_large || rc == CURLE_FILESIZE_EXCEEDED)
    fail("cannot fetch image URL '%s': the image is %s", u, too_large.c_str());
  switch (rc) {
    case CURLE_OK: break;
    case CURLE_HTTP_RETURNED_ERROR:
      fail("cannot fetch image URL '%s': the server answered HTTP %ld", u, status);
    case CURLE_OPERATION_TIMEDOUT:
      fail("cannot fetch image URL '%s': timed out after %g s", u, limits.timeout_s);
    case CURLE_TOO_MANY_REDIRECTS:
      fail("cannot fetch image URL '%s': too many redirects (at most %d are followed)", u,
           limits.max_redirects);
    case CURLE_UNSUPPORTED_PROTOCOL:
      fail("cannot fetch image URL '%s': redirected to a URL that is not http:// or https://", u);
    default:
      fail("cannot fetch image URL '%s': %s", u, errbuf[0] ? errbuf : curl_easy_strerror(rc));
  }
  // A final 1xx/3xx (e.g. a redirect without Location) carries no image.
  if (status < 200 || status >= 300)
    fail("cannot fetch image URL '%s': the server answered HTTP %ld", u, status);
  return std::move(sink.body);
}

}  // namespace tandem
