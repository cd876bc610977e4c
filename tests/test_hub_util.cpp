#include "test_hub_util.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "catalog/blob_hash.h"

namespace tandem::test {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string sha256_hex(const std::string& data) {
  catalog::BlobHash h(false, data.size());
  h.update(data.data(), data.size());
  return h.hex();
}

std::string git_blob_id(const std::string& data) {
  catalog::BlobHash h(true, data.size());
  h.update(data.data(), data.size());
  return h.hex();
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = char(x & 0xff);
  }
  return out;
}

// ---- FakeHub ----

namespace {

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

FakeHub::FakeHub() {
  server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back({req.method, req.path, req.get_header_value("Range"),
                     req.get_header_value("Authorization")});
    if (!token_.empty() && req.get_header_value("Authorization") != "Bearer " + token_) {
      res.status = 401;
      res.set_content(R"({"error": "Invalid credentials in Authorization header"})",
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server_.Get(R"(/api/models/([^/]+/[^/]+)/revision/(.+))", [this](const httplib::Request& req,
                                                                   httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = std::string(req.matches[1]) + "@" + percent_decode(req.matches[2]);
    auto it = repos_.find(key);
    if (it == repos_.end()) {
      res.status = 404;
      res.set_content(R"({"error": "Repository not found"})", "application/json");
      return;
    }
    res.set_content(listing(it->second, req.matches[1]), "application/json");
  });
  server_.Get(R"(/([^/]+/[^/]+)/resolve/([0-9a-f]{40})/(.+))",
              [this](const httplib::Request& req, httplib::Response& res) {
                std::unique_lock<std::mutex> lock(mu_);
                const std::string repo = req.matches[1], commit = req.matches[2],
                                  file = percent_decode(req.matches[3]);
                const FakeFile* found = nullptr;
                for (const auto& [key, r] : repos_)
                  if (key.rfind(repo + "@", 0) == 0 && r.commit == commit && r.files.count(file))
                    found = &r.files.at(file);
                if (!found) {
                  res.status = 404;
                  return;
                }
                if (auto it = status_.find(file); it != status_.end()) {
                  res.status = it->second;
                  status_.erase(it);
                  return;
                }
                auto data = std::make_shared<std::string>(found->data);
                if (corrupt_.count(file) && !data->empty()) (*data)[data->size() / 2] ^= 0x5a;
                size_t drop_at = 0;
                if (auto it = drop_.find(file); it != drop_.end()) {
                  drop_at = it->second;
                  drop_.erase(it);
                }
                res.set_header("X-Repo-Commit", commit);
                res.set_content_provider(data->size(), "application/octet-stream",
                                         [this, data, drop_at, file](size_t offset, size_t length,
                                                                     httplib::DataSink& sink) {
                                           size_t n = std::min<size_t>(length, 64 * 1024);
                                           bool drop = false;
                                           if (drop_at && offset + n > drop_at) {
                                             n = offset < drop_at ? drop_at - offset : 0;
                                             drop = true;
                                           }
                                           if (n) sink.write(data->data() + offset, n);
                                           {
                                             std::lock_guard<std::mutex> l(mu_);
                                             served_[file] += n;
                                           }
                                           return !drop;
                                         });
              });
  port_ = server_.bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_.listen_after_bind(); });
  // stop() before the loop runs would be lost (and the join would hang).
  while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

FakeHub::~FakeHub() {
  server_.stop();
  thread_.join();
}

std::string FakeHub::endpoint() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

void FakeHub::add_repo(const std::string& repo, const std::string& commit,
                       std::vector<FakeFile> files, const std::string& revision) {
  std::lock_guard<std::mutex> lock(mu_);
  Repo r;
  r.commit = commit;
  for (auto& f : files) r.files[f.name] = std::move(f);
  repos_[repo + "@" + revision] = std::move(r);
}

std::string FakeHub::listing(const Repo& r, const std::string& repo) const {
  json siblings = json::array();
  for (const auto& [name, f] : r.files) {
    json s = {{"rfilename", name}, {"size", f.data.size()}};
    s["blobId"] = git_blob_id(f.lfs ? "version https://git-lfs.github.com/spec/v1\n" : f.data);
    if (f.lfs)
      s["lfs"] = {{"sha256", sha256_hex(f.data)}, {"size", f.data.size()}, {"pointerSize", 134}};
    siblings.push_back(s);
  }
  return json{{"id", repo}, {"sha", r.commit}, {"siblings", siblings}}.dump();
}

void FakeHub::drop_once(const std::string& file, size_t after_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_[file] = after_bytes;
}
void FakeHub::status_once(const std::string& file, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_[file] = status;
}
void FakeHub::corrupt(const std::string& file) {
  std::lock_guard<std::mutex> lock(mu_);
  corrupt_[file] = true;
}
void FakeHub::require_token(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  token_ = token;
}
std::vector<FakeHub::Seen> FakeHub::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}
size_t FakeHub::request_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_.size();
}
size_t FakeHub::file_requests(const std::string& file) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Seen& s : seen_)
    if (s.path.find("/resolve/") != std::string::npos && s.path.size() >= file.size() &&
        s.path.compare(s.path.size() - file.size(), file.size(), file) == 0)
      ++n;
  return n;
}
size_t FakeHub::bytes_served(const std::string& file) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = served_.find(file);
  return it == served_.end() ? 0 : it->second;
}
void FakeHub::clear_log() {
  std::lock_guard<std::mutex> lock(mu_);
  seen_.clear();
  served_.clear();
}

// ---- ScopedEnv ----

void ScopedEnv::set(const std::string& name, const char* value) {
  const char* old = std::getenv(name.c_str());
  saved_.emplace_back(name, old ? std::make_unique<std::string>(old) : nullptr);
  if (value)
    setenv(name.c_str(), value, 1);
  else
    unsetenv(name.c_str());
}

ScopedEnv::~ScopedEnv() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second)
      setenv(it->first.c_str(), it->second->c_str(), 1);
    else
      unsetenv(it->first.c_str());
  }
}

// ---- HubTestBase ----

HubTestBase::HubTestBase() {
  env_.set("HF_HOME", hf_home().c_str());
  env_.set("XDG_CONFIG_HOME", (tmp_.path() + "/config").c_str());
  env_.set("HF_ENDPOINT", hub_.endpoint().c_str());
  for (const char* v :
       {"HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE",
        "TANDEM_TEST_FREE_BYTES", "TANDEM_CATALOG", "TANDEM_API_KEY"})
    env_.set(v, nullptr);
}

std::string HubTestBase::repo_dir(const std::string& repo) const {
  std::string name = repo;
  name.replace(name.find('/'), 1, "--");
  return hub_cache() + "/models--" + name;
}

void HubTestBase::use_catalog(const std::string& aliases_json) {
  const std::string path = tmp_.path() + "/catalog.json";
  std::ofstream(path) << R"({"version": 1, "aliases": )" << aliases_json << "}";
  env_.set("TANDEM_CATALOG", path.c_str());
}

std::string HubTestBase::make_cached_snapshot(const std::string& repo, const std::string& commit,
                                              const std::vector<FakeFile>& files,
                                              const std::string& revision) {
  const std::string dir = repo_dir(repo);
  fs::create_directories(dir + "/blobs");
  fs::create_directories(dir + "/refs");
  const std::string snap = dir + "/snapshots/" + commit;
  fs::create_directories(snap);
  for (const FakeFile& f : files) {
    const std::string blob = f.lfs ? sha256_hex(f.data) : git_blob_id(f.data);
    std::ofstream(dir + "/blobs/" + blob, std::ios::binary) << f.data;
    fs::create_symlink("../../blobs/" + blob, snap + "/" + f.name);
  }
  std::ofstream(dir + "/refs/" + revision) << commit;
  return snap;
}

}  // namespace tandem::test
