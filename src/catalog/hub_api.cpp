#include "catalog/hub_api.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

namespace tandem::catalog {

namespace {

using json = nlohmann::json;

constexpr size_t kMaxListingBytes = size_t(64) << 20;
constexpr int kListingAttempts = 3;

size_t append_body(char* data, size_t size, size_t count, void* user) {
  auto& body = *static_cast<std::string*>(user);
  const size_t n = size * count;
  if (body.size() + n > kMaxListingBytes) return 0;
  body.append(data, n);
  return n;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool lower_hex(const std::string& s, size_t len) {
  return s.size() == len && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

// Root-level files a model folder uses besides the weights.
const std::set<std::string> kSupportFiles = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "tekken.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "model.safetensors.index.json",
};

}  // namespace

RepoListing parse_listing(const std::string& body, const std::string& repo) {
  const json j = json::parse(body, nullptr, false);
  auto bad = [&](const std::string& why) -> void {
    fail("the hub's file listing of %s is malformed: %s", repo.c_str(), why.c_str());
  };
  if (j.is_discarded() || !j.is_object()) bad("not a JSON object");
  RepoListing l;
  if (!j.contains("sha") || !j["sha"].is_string() || !is_commit_id(j["sha"].get<std::string>()))
    bad("no commit id (\"sha\")");
  l.commit = j["sha"].get<std::string>();
  if (!j.contains("siblings") || !j["siblings"].is_array()) bad("no \"siblings\" array");
  for (const json& s : j["siblings"]) {
    if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string())
      bad("a sibling without \"rfilename\"");
    RepoFile f;
    f.name = s["rfilename"].get<std::string>();
    if (f.name.empty() || f.name.front() == '/' || f.name.find("..") != std::string::npos ||
        f.name.find('\\') != std::string::npos)
      bad("unsafe file name \"" + f.name + "\"");
    if (s.contains("size") && s["size"].is_number_unsigned()) f.size = s["size"].get<uint64_t>();
    if (s.contains("blobId") && s["blobId"].is_string()) f.blob_id = s["blobId"].get<std::string>();
    if (s.contains("lfs") && s["lfs"].is_object()) {
      const json& lfs = s["lfs"];
      if (lfs.contains("sha256") && lfs["sha256"].is_string())
        f.sha256 = lfs["sha256"].get<std::string>();
      if (lfs.contains("size") && lfs["size"].is_number_unsigned())
        f.size = lfs["size"].get<uint64_t>();
    }
    if (!f.sha256.empty() && !lower_hex(f.sha256, 64)) bad("bad sha256 for " + f.name);
    if (!f.blob_id.empty() && !lower_hex(f.blob_id, 40)) bad("bad blobId for " + f.name);
    l.files.push_back(std::move(f));
  }
  return l;
}

RepoListing fetch_listing(const HubEnv& env, const RepoRef& ref) {
  char* rev = curl_easy_escape(nullptr, ref.revision.c_str(), int(ref.revision.size()));
  const std::string url =
      env.endpoint + "/api/models/" + ref.repo + "/revision/" + (rev ? rev : "") + "?blobs=true";
  curl_free(rev);
  const std::string what = ref.display();
  for (int attempt = 1;; ++attempt) {
    CurlHeaders headers;
    CurlHandle h = hub_handle(env, url, headers);
    std::string body;
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, append_body);
    curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h.get(), CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h.get(), CURLOPT_TIMEOUT, 60L);
    const CURLcode rc = curl_easy_perform(h.get());
    long status = 0;
    curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OK && status >= 200 && status < 300) return parse_listing(body, ref.repo);

    const std::string detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT ||
        rc == CURLE_COULDNT_RESOLVE_PROXY)
      throw HubError("cannot reach " + env.endpoint + " to list " + what + ": " + detail, true, 0);
    if (rc == CURLE_HTTP_RETURNED_ERROR && !retryable_status(status)) {
      const std::string page = "https://huggingface.co/" + ref.repo;
      if (status == 401 || status == 403)
        throw HubError(strprintf("%s: the hub answered HTTP %ld: the repo does not exist, or it is "
                                 "gated or private: check the name, accept its license at %s, and "
                                 "set HF_TOKEN%s",
                                 what.c_str(), status, page.c_str(),
                                 env.token.empty() ? " (no token is set)" : ""),
                       false, status);
      if (status == 404)
        throw HubError(strprintf("%s: not found on %s (HTTP 404): check the repo name and the "
                                 "revision '%s'",
                                 what.c_str(), env.endpoint.c_str(), ref.revision.c_str()),
                       false, status);
      throw HubError(
          strprintf("%s: the hub answered HTTP %ld to the file listing", what.c_str(), status),
          false, status);
    }
    if (attempt >= kListingAttempts) {
      if (rc == CURLE_HTTP_RETURNED_ERROR)
        throw HubError(strprintf("%s: the hub answered HTTP %ld to the file listing (%d attempts)",
                                 what.c_str(), status, attempt),
                       false, status);
      throw HubError("cannot list " + what + " on " + env.endpoint + ": " + detail,
                     curl_unreachable(rc), status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500 << (attempt - 1)));
  }
}

std::vector<RepoFile> select_model_files(const RepoListing& listing, const std::string& repo) {
  bool has_transformers_shards = false, has_config = false;
  for (const RepoFile& f : listing.files) {
    if (f.name.find('/') != std::string::npos) continue;
    if (ends_with(f.name, ".safetensors") && f.name.rfind("consolidated", 0) != 0)
      has_transformers_shards = true;
    if (f.name == "config.json") has_config = true;
  }
  std::vector<RepoFile> out;
  bool has_weights = false;
  for (const RepoFile& f : listing.files) {
    if (f.name.find('/') != std::string::npos) continue;  // subfolders: original/, onnx/, ...
    bool take = kSupportFiles.count(f.name) > 0 || ends_with(f.name, ".jinja");
    if (ends_with(f.name, ".safetensors")) {
      const bool consolidated = f.name.rfind("consolidated", 0) == 0;
      take = !(consolidated && has_transformers_shards);
      has_weights = has_weights || take;
    }
    if (take) out.push_back(f);
  }
  if (!has_config)
    fail("%s has no config.json at its root: it is not a transformers-style model repo",
         repo.c_str());
  if (!has_weights) {
    std::string formats;
    for (const RepoFile& f : listing.files)
      for (const char* ext : {".gguf", ".bin", ".pth", ".pt", ".onnx", ".h5", ".msgpack"})
        if (ends_with(f.name, ext) && formats.find(ext) == std::string::npos)
          formats += std::string(formats.empty() ? "" : ", ") + ext;
    fail("%s has no .safetensors weights%s; tandem loads safetensors checkpoints only",
         repo.c_str(), formats.empty() ? "" : (" (only " + formats + ")").c_str());
  }
  for (const RepoFile& f : out)
    if (f.blob_name().empty())
      fail("the hub's listing of %s gives neither an LFS sha256 nor a blob id for %s", repo.c_str(),
           f.name.c_str());
  return out;
}

}  // namespace tandem::catalog
