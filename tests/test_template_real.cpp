// The real chat templates of Gemma 3, Qwen3, Llama 3.1/3.2, Gemma 4 and
// Ministral 3 must render every recorded conversation byte-exactly as
// transformers' apply_chat_template did (tests/fixtures/templates/<name>.json,
// made by tools/fixtures/make_template_fixtures.py); a case transformers
// rejected must be rejected too.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_util.h"
#include "text/chat_template.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string fixtures_dir() {
  return test::source_dir() + "/tests/fixtures/templates";
}

json load_fixture(const std::string& name) {
  std::ifstream f(fixtures_dir() + "/" + name + ".json");
  if (!f) return json();
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

std::string npm_cache_dir(const std::string& name) {
  const char* c = std::getenv("TANDEM_CACHE");
  const char* home = std::getenv("HOME");
  std::string root = c ? std::string(c) : std::string(home ? home : "") + "/.cache/tandem";
  return root + "/tokenizers/" + name;
}

// The recorded local time of a case, for strftime_now.
jinja::RenderOptions options_for(const json& c) {
  jinja::RenderOptions o;
  std::tm tm{};
  const std::string now = c.value("now", "2025-01-01T00:00:00");
  if (std::sscanf(now.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec) == 6) {
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    std::tm copy = tm;
    timegm(&copy);  // fills tm_wday / tm_yday
    tm.tm_wday = copy.tm_wday;
    tm.tm_yday = copy.tm_yday;
  }
  o.clock = [tm] { return tm; };
  return o;
}

struct Tally {
  int total = 0, matched = 0;
};

// Renders every case of the fixture with `tpl`; returns how many matched.
Tally check_cases(const ChatTemplate& tpl, const json& doc, const std::string& label) {
  Tally t;
  for (const auto& c : doc["cases"]) {
    ++t.total;
    const std::string cname = c["name"].get<std::string>();
    std::string got, err;
    try {
      got = tpl.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(),
                       c["kwargs"], options_for(c));
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (c.contains("error")) {
      EXPECT_FALSE(err.empty()) << label << "/" << cname << ": transformers raised "
                                << c["error"].get<std::string>() << " but tandem rendered:\n"
                                << got;
      if (!err.empty()) ++t.matched;
      continue;
    }
    const std::string want = c["prompt"].get<std::string>();
    EXPECT_TRUE(err.empty()) << label << "/" << cname << ": tandem raised " << err;
    EXPECT_EQ(got, want) << label << "/" << cname;
    if (err.empty() && got == want) ++t.matched;
  }
  return t;
}

std::map<std::string, std::string> special_tokens(const json& doc) {
  std::map<std::string, std::string> m;
  if (doc.contains("special_tokens"))
    for (auto it = doc["special_tokens"].begin(); it != doc["special_tokens"].end(); ++it)
      if (it.value().is_string()) m[it.key()] = it.value().get<std::string>();
  return m;
}

void run_real(const std::string& name, bool from_npm) {
  json doc = load_fixture(name);
  ASSERT_FALSE(doc.is_null()) << "missing fixture tests/fixtures/templates/" << name << ".json";
  ASSERT_GE(doc["cases"].size(), 30u);
  const std::string source = doc["chat_template"].get<std::string>();

  // 1. The template text recorded in the fixture, with its special tokens.
  ChatTemplate embedded = ChatTemplate::from_string(source, special_tokens(doc));
  Tally t = check_cases(embedded, doc, name);
  std::printf("[ %s ] %d/%d conversations byte-exact (%s)\n", name.c_str(), t.matched, t.total,
              doc.value("engine", "?").c_str());

  // 2. The same template loaded from its folder, as a server would.
  const std::string dir = from_npm ? npm_cache_dir(name) : fixtures_dir() + "/" + name;
  if (!fs::exists(dir + "/tokenizer_config.json")) {
    GTEST_SKIP() << "real tokenizer files absent in " << dir
                 << "; fetch them with scripts/fetch_tokenizers.sh";
  }
  ChatTemplate loaded = ChatTemplate::from_folder(dir);
  ASSERT_EQ(loaded.source(loaded.select(false)), source)
      << dir << " holds a different template than the fixture was made from";
  for (const auto& kv : special_tokens(doc)) {
    if (kv.first != "bos_token" && kv.first != "eos_token") continue;
    auto it = loaded.special_tokens().find(kv.first);
    ASSERT_TRUE(it != loaded.special_tokens().end()) << kv.first;
    EXPECT_EQ(it->second, kv.second) << kv.first;
  }
  Tally t2 = check_cases(loaded, doc, name + "(folder)");
  EXPECT_EQ(t2.matched, t2.total);
}

TEST(ChatTemplateReal, Gemma3) {
  run_real("gemma3", true);
}
TEST(ChatTemplateReal, Qwen3) {
  run_real("qwen3", true);
}
TEST(ChatTemplateReal, Llama3_1) {
  run_real("llama3_1", true);
}
TEST(ChatTemplateReal, Llama3_2) {
  run_real("llama3_2", false);
}
TEST(ChatTemplateReal, Gemma4) {
  run_real("gemma4", false);
}
TEST(ChatTemplateReal, Gemma4E2B) {
  run_real("gemma4_e2b", false);
}
TEST(ChatTemplateReal, Ministral3) {
  run_real("ministral3", false);
}

// One ChatTemplate serves concurrent requests: rendering shares only the
// immutable syntax tree.
TEST(ChatTemplateReal, ConcurrentRendersAgree) {
  json doc = load_fixture("gemma4_e2b");
  ASSERT_FALSE(doc.is_null());
  ChatTemplate tpl =
      ChatTemplate::from_string(doc["chat_template"].get<std::string>(), special_tokens(doc));
  std::vector<std::thread> threads;
  std::vector<int> matched(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round)
        for (const auto& c : doc["cases"]) {
          if (!c.contains("prompt")) continue;
          std::string got =
              tpl.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(),
                         c["kwargs"], options_for(c));
          matched[t] += got == c["prompt"].get<std::string>();
        }
    });
  }
  for (auto& th : threads) th.join();
  int want = 0;
  for (const auto& c : doc["cases"]) want += c.contains("prompt");
  for (int t = 0; t < 4; ++t) EXPECT_EQ(matched[t], 5 * want) << "thread " << t;
}

}  // namespace
}  // namespace tandem
