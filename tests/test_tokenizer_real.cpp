// Real tokenizers (Gemma 3, Qwen3, Llama 3.1) against transformers' reference
// ids and decodes (tests/fixtures/tokenizer/<name>.json, made by
// tools/fixtures/make_tokenizer_fixtures.py) on a corpus of 2100 strings.
// The tokenizer files come from scripts/fetch_tokenizers.sh's cache; a test
// skips, printing that command, when they are absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_util.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace tandem::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

std::string cache_dir(const std::string& name) {
  const char* c = std::getenv("TANDEM_CACHE");
  const char* home = std::getenv("HOME");
  std::string root = c && *c ? std::string(c) : std::string(home ? home : "") + "/.cache/tandem";
  return root + "/tokenizers/" + name;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    json j = read_json(source_dir() + "/tests/fixtures/tokenizer/corpus.json");
    return j.at("texts").get<std::vector<std::string>>();
  }();
  return texts;
}

std::string show_ids(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 40; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + (v.size() > 40 ? ",...]" : "]");
}

class RealTokenizer : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string dir = cache_dir(GetParam());
    if (!fs::exists(dir + "/tokenizer.json")) {
      GTEST_SKIP() << "tokenizer files for " << GetParam() << " are not in " << dir
                   << "; fetch them with: scripts/fetch_tokenizers.sh";
    }
    // Loaded once per tokenizer for the whole suite (Gemma's file is 33 MB).
    static std::map<std::string, text::Tokenizer> loaded;
    auto it = loaded.find(GetParam());
    if (it == loaded.end()) it = loaded.emplace(GetParam(), text::Tokenizer::load(dir)).first;
    tok_ = it->second;
    ref_ = read_json(source_dir() + "/tests/fixtures/tokenizer/" + GetParam() + ".json");
  }
  text::Tokenizer tok_;
  json ref_;
};

TEST_P(RealTokenizer, IdsMatchTransformers) {
  const auto& texts = corpus();
  ASSERT_EQ(ref_.at("ids").size(), texts.size());
  size_t ok = 0, ok_plain = 0, shown = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto want = ref_["ids"][i].get<std::vector<int32_t>>();
    auto want_plain = ref_["ids_plain"][i].get<std::vector<int32_t>>();
    auto got = tok_.encode(texts[i], true);
    auto got_plain = tok_.encode(texts[i], false);
    ok += got == want;
    ok_plain += got_plain == want_plain;
    if ((got != want || got_plain != want_plain) && shown++ < 8) {
      ADD_FAILURE() << GetParam() << " text #" << i << " " << json(texts[i]).dump() << "\n  want "
                    << show_ids(want) << "\n  got  " << show_ids(got) << "\n  want plain "
                    << show_ids(want_plain) << "\n  got plain  " << show_ids(got_plain);
    }
  }
  std::printf("%s: ids with specials %zu/%zu, without %zu/%zu\n", GetParam().c_str(), ok,
              texts.size(), ok_plain, texts.size());
  EXPECT_EQ(ok, texts.size());
  EXPECT_EQ(ok_plain, texts.size());
}

TEST_P(RealTokenizer, DecodeMatchesTransformers) {
  const auto& texts = corpus();
  size_t ok = 0, shown = 0, total = 0;
  auto check = [&](const std::vector<int32_t>& ids, bool skip, const std::string& want,
                   const std::string& what) {
    std::string got = tok_.decode(ids, skip);
    ++total;
    ok += got == want;
    if (got != want && shown++ < 8)
      ADD_FAILURE() << GetParam() << " " << what << (skip ? " skip" : "") << " ids "
                    << show_ids(ids) << "\n  want " << json(want).dump() << "\n  got  "
                    << json(got).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = ref_["ids"][i].get<std::vector<int32_t>>();
    std::string k = std::to_string(i);
    std::string dec = ref_["dec"].contains(k) ? ref_["dec"][k].get<std::string>() : texts[i];
    std::string dec_skip =
        ref_["dec_skip"].contains(k) ? ref_["dec_skip"][k].get<std::string>() : texts[i];
    check(ids, false, dec, "text #" + k);
    check(ids, true, dec_skip, "text #" + k);
  }
  for (const json& p : ref_["probes"]) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    check(ids, false, p["dec"].get<std::string>(), "probe");
    check(ids, true, p["dec_skip"].get<std::string>(), "probe");
  }
  std::printf("%s: decodes %zu/%zu\n", GetParam().c_str(), ok, total);
  EXPECT_EQ(ok, total);
}

// Streaming: every push() is whole UTF-8 and the pieces concatenate to the
// batch decode, for every corpus entry and probe, with and without specials.
TEST_P(RealTokenizer, StreamingEqualsBatch) {
  std::vector<std::vector<int32_t>> seqs;
  for (const json& ids : ref_["ids"]) seqs.push_back(ids.get<std::vector<int32_t>>());
  for (const json& p : ref_["probes"]) seqs.push_back(p["ids"].get<std::vector<int32_t>>());
  size_t ok = 0, total = 0;
  for (const auto& ids : seqs) {
    for (bool skip : {false, true}) {
      text::Detokenizer d = tok_.detokenizer(skip);
      std::string streamed;
      bool whole = true;
      for (int32_t id : ids) {
        std::string piece = d.push(id);
        // Each piece must be valid UTF-8 on its own.
        std::string back = json(piece).dump(-1, ' ', false, json::error_handler_t::replace);
        whole = whole && json::parse(back).get<std::string>() == piece;
        streamed += piece;
      }
      streamed += d.flush();
      ++total;
      bool good = whole && streamed == tok_.decode(ids, skip);
      ok += good;
      if (!good && total - ok <= 5)
        ADD_FAILURE() << GetParam() << " streaming differs for " << show_ids(ids);
    }
  }
  std::printf("%s: streaming == batch %zu/%zu\n", GetParam().c_str(), ok, total);
  EXPECT_EQ(ok, total);
}

TEST_P(RealTokenizer, SpecialTokenInfo) {
  std::string name = GetParam();
  if (name == "llama3_1") {
    EXPECT_EQ(tok_.bos_id(), 128000);
    EXPECT_EQ(tok_.eos_id(), 128009);  // <|eot_id|> per tokenizer_config.json
    EXPECT_EQ(tok_.vocab_size(), 128256);
  } else if (name == "qwen3") {
    EXPECT_EQ(tok_.bos_id(), -1);
    EXPECT_EQ(tok_.eos_id(), 151645);
    EXPECT_EQ(tok_.vocab_size(), 151669);
  } else if (name == "gemma3") {
    EXPECT_EQ(tok_.bos_id(), 2);
    EXPECT_EQ(tok_.eos_id(), 106);  // <end_of_turn>
    EXPECT_EQ(tok_.vocab_size(), 262145);
    EXPECT_EQ(tok_.token_to_id("<start_of_turn>"), 105);
    EXPECT_EQ(tok_.id_to_token(105), "<start_of_turn>");
  }
  EXPECT_TRUE(tok_.is_special(tok_.eos_id()));
}

// One tokenizer used from several threads at once gives the same ids.
TEST_P(RealTokenizer, ConcurrentEncodeIsConsistent) {
  const auto& texts = corpus();
  const json& want = ref_.at("ids");  // const: safe to read from many threads
  std::vector<size_t> bad(4, 0);
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&, t] {
      for (size_t i = t; i < texts.size(); i += 2)
        bad[t] += tok_.encode(texts[i], true) != want[i].get<std::vector<int32_t>>();
    });
  for (auto& x : th) x.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0u) << "thread " << t;
}

INSTANTIATE_TEST_SUITE_P(TokenizerReal, RealTokenizer,
                         ::testing::Values("gemma3", "qwen3", "llama3_1"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem::test
