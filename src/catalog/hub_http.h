// What the Hugging Face hub client shares: the environment (endpoint, token,
// offline mode), its errors, and libcurl handles set up the same way for the
// listing and the file transfers.
#pragma once

#include <curl/curl.h>

#include <memory>
#include <string>

#include "core/error.h"

namespace tandem::catalog {

// From the environment, as huggingface_hub reads it:
//   HF_ENDPOINT     the hub or any mirror (default https://huggingface.co)
//   HF_TOKEN        sent as "Authorization: Bearer ..." (else
//                   HUGGING_FACE_HUB_TOKEN, else the file $HF_TOKEN_PATH or
//                   $HF_HOME/token that `huggingface-cli login` writes)
//   HF_HUB_OFFLINE  1/true/yes/on: no network at all, the cache only
struct HubEnv {
  std::string endpoint = "https://huggingface.co";  // no trailing slash
  std::string token;
  bool offline = false;
  static HubEnv from_environment();
};

// A failure talking to the hub. `unreachable`: no HTTP answer at all (DNS,
// connection refused, TLS, timeout before a response), which lets callers
// fall back to the cache; otherwise `status` is the HTTP status (0 if none).
class HubError : public Error {
 public:
  HubError(const std::string& msg, bool unreachable, long status)
      : Error(msg), unreachable(unreachable), status(status) {}
  bool unreachable;
  long status;
};

struct CurlDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;
using CurlHeaders = std::unique_ptr<curl_slist, SlistDeleter>;

// A handle for `url` with the options every hub request uses: http(s) only,
// redirects followed (at most 10; curl drops the Authorization header when a
// redirect leaves the host), no signals, a 10 s connect timeout, abort below
// 1 KB/s for 60 s, a User-Agent, and the token header in `headers`.
CurlHandle hub_handle(const HubEnv& env, const std::string& url, CurlHeaders& headers);

// True for curl results that mean "no HTTP answer" (see HubError::unreachable).
bool curl_unreachable(CURLcode rc);

// HTTP statuses worth retrying: 408, 429 and 5xx.
bool retryable_status(long status);

// URL-encodes each '/'-separated segment of `path`.
std::string encode_path(const std::string& path);

}  // namespace tandem::catalog
