// Helpers for the catalog and hub tests: a fake Hugging Face hub on
// 127.0.0.1 (file listing, files with Range, faults on demand, every request
// counted and its headers kept), environment variables set for one test,
// and a hand-made cache entry in the huggingface_hub layout.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace tandem::test {

struct FakeFile {
  std::string name;
  std::string data;
  bool lfs = true;  // LFS files are listed with a sha256, others by git blob id
};

// The sha256 / git blob id of `data` (the hub's checksums).
std::string sha256_hex(const std::string& data);
std::string git_blob_id(const std::string& data);

// Deterministic pseudo-random bytes.
std::string random_bytes(size_t n, uint32_t seed);

class FakeHub {
 public:
  FakeHub();
  ~FakeHub();
  std::string endpoint() const;  // "http://127.0.0.1:PORT"

  // Serves `files` for repo@revision at `commit`.
  void add_repo(const std::string& repo, const std::string& commit, std::vector<FakeFile> files,
                const std::string& revision = "main");

  // Faults, each applied once to the next request for the file.
  void drop_once(const std::string& file, size_t after_bytes);  // close mid-body
  void status_once(const std::string& file, int status);        // e.g. 503
  // Serve the file with one byte changed, every time (the listing stays right).
  void corrupt(const std::string& file);
  // Answer 401 to any request without "Authorization: Bearer TOKEN".
  void require_token(const std::string& token);

  struct Seen {
    std::string method, path, range, authorization;
  };
  std::vector<Seen> requests() const;
  size_t request_count() const;
  size_t file_requests(const std::string& file) const;  // GETs of .../resolve/.../file
  size_t bytes_served(const std::string& file) const;
  void clear_log();

 private:
  struct Repo {
    std::string commit;
    std::map<std::string, FakeFile> files;
  };
  std::string listing(const Repo& r, const std::string& repo) const;

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::map<std::string, Repo> repos_;  // "org/name@rev"
  std::map<std::string, size_t> drop_;
  std::map<std::string, int> status_;
  std::map<std::string, bool> corrupt_;
  std::map<std::string, size_t> served_;
  std::string token_;
  std::vector<Seen> seen_;
};

// Sets (or with a null value unsets) environment variables, restoring them
// on destruction.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ~ScopedEnv();
  void set(const std::string& name, const char* value);

 private:
  std::vector<std::pair<std::string, std::unique_ptr<std::string>>> saved_;
};

// Base for tests that touch the cache: HF_HOME and XDG_CONFIG_HOME in a
// fresh temporary folder, HF_ENDPOINT at a FakeHub, and every variable that
// could leak the developer's own setup unset.
class HubTestBase : public ::testing::Test {
 protected:
  HubTestBase();
  std::string hf_home() const { return tmp_.path() + "/hf"; }
  std::string hub_cache() const { return hf_home() + "/hub"; }
  std::string repo_dir(const std::string& repo) const;  // .../models--org--name
  // A catalog file with `json` as its "aliases", used through TANDEM_CATALOG.
  void use_catalog(const std::string& aliases_json);
  // A snapshot in the huggingface_hub layout, as another tool would leave it.
  std::string make_cached_snapshot(const std::string& repo, const std::string& commit,
                                   const std::vector<FakeFile>& files,
                                   const std::string& revision = "main");

  TempDir tmp_;
  FakeHub hub_;
  ScopedEnv env_;
};

}  // namespace tandem::test
