#include "catalog/hub_http.h"

#include <cstdlib>
#include <fstream>
#include <mutex>

namespace tandem::catalog {

namespace {

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool truthy(std::string v) {
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) fail("cannot initialise libcurl: %s", curl_easy_strerror(rc));
  });
}

}  // namespace

HubEnv HubEnv::from_environment() {
  HubEnv env;
  if (std::string e = trim(getenv_str("HF_ENDPOINT")); !e.empty()) env.endpoint = e;
  while (!env.endpoint.empty() && env.endpoint.back() == '/') env.endpoint.pop_back();
  env.token = trim(getenv_str("HF_TOKEN"));
  if (env.token.empty()) env.token = trim(getenv_str("HUGGING_FACE_HUB_TOKEN"));
  if (env.token.empty()) {
    std::string path = getenv_str("HF_TOKEN_PATH");
    if (path.empty()) {
      std::string home = getenv_str("HF_HOME");
      if (home.empty()) {
        const std::string xdg = getenv_str("XDG_CACHE_HOME");
        home = (xdg.empty() ? getenv_str("HOME") + "/.cache" : xdg) + "/huggingface";
      }
      path = home + "/token";
    }
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line)) env.token = trim(line);
  }
  env.offline = truthy(getenv_str("HF_HUB_OFFLINE"));
  return env;
}

CurlHandle hub_handle(const HubEnv& env, const std::string& url, CurlHeaders& headers) {
  init_curl_once();
  CurlHandle h(curl_easy_init());
  if (!h) fail("libcurl could not start a transfer");
  CURL* c = h.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "tandem/0.1; hf_hub/compatible");
  curl_slist* list = nullptr;
  if (!env.token.empty())
    list = curl_slist_append(list, ("Authorization: Bearer " + env.token).c_str());
  headers.reset(list);
  if (list) curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  return h;
}

bool curl_unreachable(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING: return true;
    default: return false;
  }
}

bool retryable_status(long status) {
  return status == 408 || status == 429 || (status >= 500 && status <= 599);
}

std::string encode_path(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string seg =
        path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    char* enc = curl_easy_escape(nullptr, seg.c_str(), int(seg.size()));
    out += enc ? enc : seg;
    curl_free(enc);
    if (slash == std::string::npos) break;
    out += '/';
    start = slash + 1;
  }
  return out;
}

}  // namespace tandem::catalog
