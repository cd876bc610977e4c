// Downloads from a fake Hugging Face hub on 127.0.0.1: the cache layout other
// tools share, resume with Range after an interruption, checksums, retries,
// offline mode, tokens, the disk preflight, and `tandem rm`. No internet.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "catalog/blob_hash.h"
#include "catalog/hub_api.h"
#include "test_hub_util.h"
#include "test_server_util.h"

using namespace tandem;
using namespace tandem::test;
namespace fs = std::filesystem;

namespace {

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kCommit2 = "89abcdef0123456789abcdef0123456789abcdef";
const std::string kWeights = random_bytes(300000, 1);

std::vector<FakeFile> tiny_repo() {
  return {
      {"config.json", R"({"model_type": "llama"})", false},
      {"model.safetensors", kWeights, true},
      {"tokenizer.json", R"({"version": "1.0"})", false},
      {"pytorch_model.bin", random_bytes(1000, 2), true},             // not safetensors
      {"original/consolidated.00.pth", random_bytes(1000, 3), true},  // a subfolder
      {"README.md", "# tiny", false},                                 // not a model file
  };
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

size_t count_files(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (!it->is_directory()) ++n;
  return n;
}

class Hub : public HubTestBase {
 protected:
  std::string snapshot() const { return repo_dir("test-org/tiny") + "/snapshots/" + kCommit; }
  std::string blob(const std::string& hash) const {
    return repo_dir("test-org/tiny") + "/blobs/" + hash;
  }
};

TEST(HubHash, KnownVectors) {
  catalog::BlobHash sha(false, 3);
  sha.update("abc", 3);
  EXPECT_EQ(sha.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  catalog::BlobHash git(true, 6);  // `echo hello | git hash-object --stdin`
  git.update("hello\n", 6);
  EXPECT_EQ(git.hex(), "ce013625030ba8dba906f756967f9e9ca394464a");
}

TEST(HubListing, SelectsTheModelFiles) {
  const std::string body = R"({"sha": ")" + kCommit + R"(", "siblings": [
    {"rfilename": "config.json", "size": 10, "blobId": "ce013625030ba8dba906f756967f9e9ca394464a"},
    {"rfilename": "model-00001-of-00002.safetensors", "size": 5, "lfs": {"sha256": ")" +
                           std::string(64, 'a') + R"(", "size": 5}},
    {"rfilename": "model-00002-of-00002.safetensors", "size": 5, "lfs": {"sha256": ")" +
                           std::string(64, 'b') + R"(", "size": 5}},
    {"rfilename": "model.safetensors.index.json", "size": 3, "blobId": ")" +
                           std::string(40, 'c') + R"("},
    {"rfilename": "consolidated.safetensors", "size": 9, "lfs": {"sha256": ")" +
                           std::string(64, 'd') + R"(", "size": 9}},
    {"rfilename": "tekken.json", "size": 3, "blobId": ")" +
                           std::string(40, 'e') + R"("},
    {"rfilename": "chat_template.jinja", "size": 3, "blobId": ")" +
                           std::string(40, 'f') + R"("},
    {"rfilename": "preprocessor_config.json", "size": 3, "blobId": ")" +
                           std::string(40, '1') + R"("},
    {"rfilename": "params.json", "size": 3, "blobId": ")" +
                           std::string(40, '2') + R"("},
    {"rfilename": "model.gguf", "size": 3, "blobId": ")" +
                           std::string(40, '3') + R"("},
    {"rfilename": "onnx/model.onnx", "size": 3, "blobId": ")" +
                           std::string(40, '4') + R"("}
  ]})";
  const auto listing = catalog::parse_listing(body, "org/x");
  EXPECT_EQ(listing.commit, kCommit);
  std::vector<std::string> names;
  for (const auto& f : catalog::select_model_files(listing, "org/x")) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json", "tekken.json",
                                             "chat_template.jinja", "preprocessor_config.json"}));
  EXPECT_EQ(catalog::select_model_files(listing, "org/x")[1].blob_name(), std::string(64, 'a'));
}

TEST(HubListing, RefusesReposWithoutSafetensors) {
  const std::string body = R"({"sha": ")" + kCommit + R"(", "siblings": [
    {"rfilename": "config.json", "size": 10, "blobId": ")" +
                           std::string(40, 'a') + R"("},
    {"rfilename": "pytorch_model.bin", "size": 10, "lfs": {"sha256": ")" +
                           std::string(64, 'b') + R"(", "size": 10}}]})";
  try {
    catalog::select_model_files(catalog::parse_listing(body, "org/x"), "org/x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no .safetensors weights (only .bin)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(catalog::parse_listing(R"({"sha": "nope", "siblings": []})", "org/x"), Error);
  EXPECT_THROW(catalog::parse_listing(
                   R"({"sha": ")" + kCommit + R"(", "siblings": [{"rfilename": "../x"}]})", "o/x"),
               Error);
}

TEST_F(Hub, PullWritesTheHuggingFaceCacheLayout) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  auto r = run_tandem("pull test-org/tiny");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), snapshot());
  for (const FakeFile& f : tiny_repo()) {
    const std::string link = snapshot() + "/" + f.name;
    const bool wanted =
        f.name == "config.json" || f.name == "model.safetensors" || f.name == "tokenizer.json";
    EXPECT_EQ(fs::exists(link), wanted) << f.name;
    EXPECT_EQ(hub_.file_requests(f.name), wanted ? 1u : 0u) << f.name;
    if (!wanted) continue;
    const std::string hash = f.lfs ? sha256_hex(f.data) : git_blob_id(f.data);
    ASSERT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(fs::read_symlink(link).string(), "../../blobs/" + hash);
    EXPECT_TRUE(fs::is_regular_file(blob(hash)));
    EXPECT_EQ(slurp(link), f.data) << f.name;
  }
  EXPECT_EQ(slurp(repo_dir("test-org/tiny") + "/refs/main"), kCommit);
  for (const auto& e : fs::directory_iterator(repo_dir("test-org/tiny") + "/blobs"))
    EXPECT_EQ(e.path().extension(), "") << e.path();  // no .incomplete left

  // Already there: one listing request, no file transfer.
  hub_.clear_log();
  r = run_tandem("pull test-org/tiny");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(hub_.request_count(), 1u);
  EXPECT_NE(r.err.find("up to date"), std::string::npos) << r.err;
}

TEST_F(Hub, ResumesWithRangeAfterAConnectionDrops) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  hub_.drop_once("model.safetensors", 100000);
  auto r = run_tandem("pull test-org/tiny");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("retry model.safetensors"), std::string::npos) << r.err;
  std::vector<std::string> ranges;
  for (const auto& s : hub_.requests())
    if (s.path.find("model.safetensors") != std::string::npos) ranges.push_back(s.range);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], "");
  ASSERT_EQ(ranges[1].rfind("bytes=", 0), 0u) << ranges[1];
  const size_t from = std::stoul(ranges[1].substr(6));
  EXPECT_GT(from, 0u);
  EXPECT_LE(from, 100000u);
  EXPECT_EQ(slurp(snapshot() + "/model.safetensors"), kWeights);
  // Nothing was sent twice past what the first attempt delivered.
  EXPECT_EQ(hub_.bytes_served("model.safetensors"), 100000 + kWeights.size() - from);
}

TEST_F(Hub, ResumesAnEarlierRunsIncompleteFile) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  const std::string part = blob(sha256_hex(kWeights)) + ".incomplete";
  fs::create_directories(fs::path(part).parent_path());
  std::ofstream(part, std::ios::binary) << kWeights.substr(0, 123456);
  auto r = run_tandem("pull test-org/tiny");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& s : hub_.requests())
    if (s.path.find("model.safetensors") != std::string::npos) {
      EXPECT_EQ(s.range, "bytes=123456-");
    }
  EXPECT_EQ(hub_.bytes_served("model.safetensors"), kWeights.size() - 123456);
  EXPECT_EQ(slurp(snapshot() + "/model.safetensors"), kWeights);
  EXPECT_FALSE(fs::exists(part));
}

TEST_F(Hub, RetriesAServerError) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  hub_.status_once("model.safetensors", 503);
  auto r = run_tandem("pull test-org/tiny");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("HTTP 503"), std::string::npos) << r.err;
  EXPECT_EQ(hub_.file_requests("model.safetensors"), 2u);
  EXPECT_EQ(slurp(snapshot() + "/model.safetensors"), kWeights);
}

TEST_F(Hub, ChecksumMismatchFailsAndLinksNothing) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  hub_.corrupt("model.safetensors");
  auto r = run_tandem("pull test-org/tiny");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(
      r.err.find("model.safetensors: checksum mismatch: expected sha256 " + sha256_hex(kWeights)),
      std::string::npos)
      << r.err;
  EXPECT_EQ(count_files(repo_dir("test-org/tiny") + "/snapshots"), 0u);
  EXPECT_FALSE(fs::exists(blob(sha256_hex(kWeights))));
  EXPECT_FALSE(fs::exists(blob(sha256_hex(kWeights)) + ".incomplete"));
  EXPECT_FALSE(fs::exists(repo_dir("test-org/tiny") + "/refs/main"));
}

TEST_F(Hub, OfflineUsesTheCacheAndNeverTheNetwork) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  ASSERT_EQ(run_tandem("pull test-org/tiny").exit_code, 0);
  hub_.clear_log();
  env_.set("HF_HUB_OFFLINE", "1");
  auto r = run_tandem("pull test-org/tiny");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), snapshot());
  r = run_tandem("pull test-org/other");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HF_HUB_OFFLINE"), std::string::npos) << r.err;
  EXPECT_EQ(hub_.request_count(), 0u);
}

TEST_F(Hub, UnreachableHubFallsBackToTheCache) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  ASSERT_EQ(run_tandem("pull test-org/tiny").exit_code, 0);
  env_.set("HF_ENDPOINT", "http://127.0.0.1:1");  // nothing listens there
  auto r = run_tandem("pull test-org/tiny");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), snapshot());
  EXPECT_NE(r.err.find("using the cached snapshot"), std::string::npos) << r.err;
  r = run_tandem("pull test-org/other");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot reach http://127.0.0.1:1"), std::string::npos) << r.err;
}

TEST_F(Hub, TokenIsSentAsAuthorization) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  hub_.require_token("hf_secret");
  auto r = run_tandem("pull test-org/tiny");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HF_TOKEN"), std::string::npos) << r.err;
  hub_.clear_log();
  env_.set("HF_TOKEN", "hf_secret");
  r = run_tandem("pull test-org/tiny");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_GE(hub_.request_count(), 4u);  // the listing and three files
  for (const auto& s : hub_.requests()) EXPECT_EQ(s.authorization, "Bearer hf_secret") << s.path;
}

TEST_F(Hub, RevisionIsListedAndItsRefWritten) {
  hub_.add_repo("test-org/tiny", kCommit2, tiny_repo(), "v2");
  auto r = run_tandem("pull test-org/tiny@v2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(hub_.requests().at(0).path, "/api/models/test-org/tiny/revision/v2");
  EXPECT_EQ(slurp(repo_dir("test-org/tiny") + "/refs/v2"), kCommit2);
  EXPECT_EQ(trim(r.out), repo_dir("test-org/tiny") + "/snapshots/" + kCommit2);
}

TEST_F(Hub, DiskPreflightRefusesUnlessForced) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  env_.set("TANDEM_TEST_FREE_BYTES", "300000");  // < 1.1 x 300 KB
  auto r = run_tandem("pull test-org/tiny");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not enough disk space"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("300.0 KB is free"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(hub_.request_count(), 1u);  // the listing only
  EXPECT_FALSE(fs::exists(snapshot()));

  // `tandem run` names the pull command that overrides it.
  use_catalog(R"({"tiny": {"repo": "test-org/tiny", "revision": "main", "family": "llama",
      "modalities": ["text"], "format": "safetensors", "quantization": "f32",
      "size_bytes": 300000, "context_length": 128, "sampling": {},
      "reasoning_parser": null, "tool_call_parser": null}})");
  r = run_tandem("run tiny --ids 1,2 -n 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tandem pull tiny --force"), std::string::npos) << r.err;

  r = run_tandem("pull test-org/tiny --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("continuing (--force)"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(snapshot() + "/model.safetensors"), kWeights);

  // Enough room: no question, no warning.
  env_.set("TANDEM_TEST_FREE_BYTES", "400000");
  ASSERT_EQ(run_tandem("rm -y test-org/tiny").exit_code, 0);
  r = run_tandem("pull test-org/tiny");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Hub, RunDownloadsAnAliasAndGenerates) {
  const std::string fixture = fixture_dir("llama-f32");
  hub_.add_repo("test-org/llama", kCommit,
                {{"config.json", slurp(fixture + "/config.json"), false},
                 {"model.safetensors", slurp(fixture + "/model.safetensors"), true},
                 {"reference.json", "{}", false}});
  use_catalog(R"({"tiny-llama": {"repo": "test-org/llama", "revision": "main",
      "family": "llama", "modalities": ["text"], "format": "safetensors", "quantization": "f32",
      "size_bytes": 800000, "context_length": 128, "sampling": {"temperature": 0.6},
      "reasoning_parser": null, "tool_call_parser": null}})");
  auto r = run_tandem("run tiny-llama --ids 1,2,3 -n 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto local = run_tandem("run " + fixture + " --ids 1,2,3 -n 4 --json");
  EXPECT_EQ(r.out, local.out);
  EXPECT_EQ(hub_.file_requests("reference.json"), 0u);
  // Cached now: `logits` (which never downloads) finds it; offline `run` too.
  EXPECT_EQ(run_tandem("logits tiny-llama --ids 1,2").exit_code, 0);
  env_.set("HF_HUB_OFFLINE", "1");
  hub_.clear_log();
  r = run_tandem("run tiny-llama --ids 1,2,3 -n 4 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, local.out);
  EXPECT_EQ(hub_.request_count(), 0u);
}

TEST_F(Hub, ServePullsThenServesUnderTheAlias) {
  const std::string fixture = fixture_dir("llama-f32");
  hub_.add_repo("test-org/llama", kCommit,
                {{"config.json", slurp(fixture + "/config.json"), false},
                 {"model.safetensors", slurp(fixture + "/model.safetensors"), true}});
  use_catalog(R"({"tiny-llama": {"repo": "test-org/llama", "revision": "main",
      "family": "llama", "modalities": ["text"], "format": "safetensors", "quantization": "f32",
      "size_bytes": 800000, "context_length": 128, "sampling": {},
      "reasoning_parser": null, "tool_call_parser": null}})");
  ChildServer server({"tiny-llama", "--threads", "1"});
  ASSERT_TRUE(server.ready()) << server.log();
  const auto models = http_get(server.port(), "/v1/models");
  ASSERT_EQ(models.status, 200) << models.raw;
  EXPECT_EQ(models.body["data"][0]["id"], "tiny-llama");
  EXPECT_NE(server.log().find("pull test-org/llama"), std::string::npos) << server.log();
  EXPECT_EQ(hub_.file_requests("model.safetensors"), 1u);
}

TEST_F(Hub, LogitsNeverDownloads) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  auto r = run_tandem("logits test-org/tiny --ids 1,2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tandem pull test-org/tiny"), std::string::npos) << r.err;
  EXPECT_EQ(hub_.request_count(), 0u);
}

TEST_F(Hub, RmRemovesTheCachedRepo) {
  hub_.add_repo("test-org/tiny", kCommit, tiny_repo());
  ASSERT_EQ(run_tandem("pull test-org/tiny").exit_code, 0);
  auto r = run_tandem("rm test-org/tiny");  // stdin is not a terminal: -y is required
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("-y"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(snapshot()));
  r = run_tandem("rm -y test-org/tiny");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("removed " + repo_dir("test-org/tiny")), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(repo_dir("test-org/tiny")));
  r = run_tandem("rm -y test-org/tiny");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not in the cache"), std::string::npos) << r.err;
}

}  // namespace
