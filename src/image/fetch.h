// Downloading images named by http(s) URLs (OpenAI "image_url" parts), with
// libcurl, bounded in size, time and redirects.
//
// Contract: fetch_url returns the response body of a 2xx answer to a GET of an
// http:// or https:// URL, following at most max_redirects redirects, and
// only to http(s) URLs. Every other outcome throws tandem::Error with a
// message meant for an API client that names the URL (truncated): a URL that
// is not http(s) (refused before any network use), a host that cannot be
// resolved or reached, an HTTP status outside 2xx ("HTTP 404"), a transfer
// that exceeds timeout_s ("timed out after 10 s"), a body larger than
// max_bytes (refused from Content-Length up front, and counted while
// receiving when the length is not announced), or too many redirects.
//
// Thread-safe: each call uses its own curl handle, and libcurl's global
// initialisation runs once. No signals are used (safe in threaded servers).
//
// The fetcher does not restrict which hosts are reached (loopback and private
// addresses included): the server enables it only on --allow-image-urls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct FetchLimits {
  size_t max_bytes = size_t(20) << 20;  // larger bodies are refused
  double timeout_s = 10;                // the whole transfer, connect included; > 0
  int max_redirects = 3;                // redirects followed; 0 refuses any
};

std::vector<uint8_t> fetch_url(const std::string& url, const FetchLimits& limits);

}  // namespace tandem
