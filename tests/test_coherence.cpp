// The coherence gate (tandem coherence, issue #9): the garbage detector on
// good answers in several scripts and on a corpus of garbage, answer
// normalization, case verdicts, golden-set loading, and the command end to
// end against servers forced to answer right, answer garbage, fail a step,
// hang, or not be there at all.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "coherence/answer_match.h"
#include "coherence/evaluate.h"
#include "coherence/garbage_detector.h"
#include "coherence/golden_set.h"
#include "coherence/report.h"
#include "coherence/script.h"
#include "core/error.h"
#include "server/model_text.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::coherence;
using namespace tandem::test;

namespace {

// ---- garbage detector ----

TEST(GarbageDetector, GoodAnswersPass) {
  const char* good[] = {
      "Tokyo",
      "7",
      "391",
      "Blue.",
      "**Paris**",
      "Seven",
      "1000000000",
      "3.14159",
      "Tokyo\n",
      "Line one\r\nLine two",
      "東京",
      "東京です。",
      "日本の首都は東京です。",
      "Москва",
      "Столица Франции — Париж.",
      "Die Hauptstadt von Frankreich ist Paris.",
      "La capitale de la France est Paris, une très belle ville.",
      "São Paulo",
      "Ελλάδα",
      "서울은 한국의 수도입니다.",
      "القاهرة",
      "नई दिल्ली",
      "กรุงเทพมหานคร",
      "Tokyo (東京)",  // two scripts, no expectation: not a mix of three
      "The capital of Japan is Tokyo, a city of about fourteen million people on Honshu.",
      "A clear daytime sky is blue because air scatters short wavelengths of sunlight more "
      "than long ones; this is called Rayleigh scattering.",
      "Yes, yes, yes.",  // three in a row is speech, four is a loop
      "Mississippi",
      "Bora Bora, Walla Walla, Baden-Baden",
      "1010101010",  // a loop without letters: a number
      "Wait....",
  };
  for (const char* g : good) {
    const GarbageVerdict v = detect_garbage(g);
    EXPECT_FALSE(v.garbage) << "'" << g << "': " << v.reason;
  }
  EXPECT_FALSE(detect_garbage("Tokyo", script_bit(Script::Latin)).garbage);
  EXPECT_FALSE(detect_garbage("東京", script_bit(Script::Cjk)).garbage);
  // One script, even an unexpected one, is not a mix (it fails as a wrong answer).
  EXPECT_FALSE(detect_garbage("東京", script_bit(Script::Latin)).garbage);
}

struct GarbageCase {
  std::string text;
  std::string reason_has;
  ScriptSet expected = 0;
};

TEST(GarbageDetector, GarbageIsFlaggedWithAReason) {
  std::string unused_run;
  for (int i = 0; i < 30; ++i) unused_run += "<unused49>";
  const std::vector<GarbageCase> corpus = {
      {"", "empty"},
      {"   \n\t  ", "whitespace only"},
      {unused_run, "<unused49>"},
      {"<pad><pad><pad>", "<pad>"},
      {"Paris<|im_end|>", "<|im_end|>"},
      {"<end_of_turn>", "<end_of_turn>"},
      {"Ã©Ã¨Ã", "mojibake"},
      {"caf\xc3\x83\xc2\xa9", "mojibake"},
      {"it\xc3\xa2\xe2\x82\xac\xe2\x84\xa2s", "mojibake"},
      {"Tok\xef\xbf\xbdyo", "U+FFFD"},
      {"Tokyo\x07", "control character U+0007"},
      {"\x1b[0mTokyo", "control character U+001B"},
      {"Tokyo\rParis", "control character U+000D"},
      {"Tokyo\xc2\x85", "control character U+0085"},
      {"\xff\xfe bad bytes", "invalid UTF-8"},
      {"!!!?!!...", "no word characters"},
      {"\xf0\x9f\x99\x82\xf0\x9f\x99\x82", "no word characters"},
      {"aaaaaaaaaaaaaaaaaaaaaaaaaaaa", "a run of 28 'a'"},
      {"Tokyo..........................", "a run of"},
      {"!!!!!?!!!!!?!!!!! ok", "'!' is 15 of 19"},
      {"the the the the", "'the' repeated 4 times"},
      {"Tokyo Tokyo Tokyo Tokyo Tokyo", "'tokyo' repeated 5 times"},
      {"banana, banana, Banana, banana", "repeated 4 times"},
      {"I am I am I am I am here", "'i am' repeated 4 times"},
      {"東京東京東京東京", "repeated"},
      {"SESESESESESESESESESESESESESESESE", "'SE' repeated 16 times"},
      {"Tokyo GPIOGPIOGPIOGPIOGPIO", "'GPIO' repeated 5 times"},
      {"ab-ab-ab-ab-", "repeated 4 times"},
      {"x y y x x y x y y x y x x y", "distinct words"},
      {"the cat sat the cat ran the cat ate the cat hid", "bigram 'the cat'"},
      {"Tokyo东京Москва", "mixed scripts Latin+Cyrillic+CJK"},
      {"Hello мир 世界 مرحبا", "mixed scripts"},
      {"Tokyo東京", "mixed scripts Latin+CJK (expected Latin)", script_bit(Script::Latin)},
      {"Parisия", "mixed scripts", script_bit(Script::Latin)},
  };
  for (const GarbageCase& g : corpus) {
    const GarbageVerdict v = detect_garbage(g.text, g.expected);
    EXPECT_TRUE(v.garbage) << "'" << g.text << "'";
    EXPECT_NE(v.reason.find(g.reason_has), std::string::npos)
        << "'" << g.text << "': reason '" << v.reason << "', expected it to mention '"
        << g.reason_has << "'";
  }
}

TEST(GarbageDetector, Scripts) {
  EXPECT_EQ(scripts_in("Tokyo 7"), script_bit(Script::Latin));
  EXPECT_EQ(scripts_in("391"), 0u);
  EXPECT_EQ(scripts_in("東京とソウル서울"), script_bit(Script::Cjk));
  EXPECT_EQ(script_set_name(scripts_in("Paris Париж")), "Latin+Cyrillic");
  EXPECT_TRUE(is_word_char(U'7'));
  EXPECT_FALSE(is_word_char(U'!'));
  EXPECT_FALSE(is_word_char(0x3002));  // 。
}

// ---- normalization and matching ----

TEST(AnswerMatch, Normalization) {
  const std::pair<const char*, const char*> cases[] = {
      {"Tokyo", "tokyo"},
      {"**Tokyo.**", "tokyo"},
      {"  Seven!\n", "seven"},
      {"「東京」。", "東京"},
      {"東京です！", "東京です"},
      {"\"Paris\"", "paris"},
      {"“Paris”", "paris"},
      {"`391`", "391"},
      {"_blue_", "blue"},
      {"'Blue'...", "blue"},
      {"TOKYO", "tokyo"},
      {"Ｔｏｋｙｏ！", "tokyo"},
      {"ПАРИЖ", "париж"},
      {"Straße", "strasse"},
      {"ÉCOLE", "école"},
      {"New   York", "new york"},
      {"¿Qué?", "qué"},
      {"7、", "7"},
      {"3.14", "3.14"},
      {"Tokyo is the capital.", "tokyo is the capital"},
      {"  ", ""},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(normalize_answer(in), want) << in;
}

TEST(AnswerMatch, MatchesAnAcceptedAnswer) {
  EXPECT_TRUE(answer_matches("Seven.", {"7", "seven"}));
  EXPECT_TRUE(answer_matches("7", {"7", "seven"}));
  EXPECT_TRUE(answer_matches("**391**", {"391"}));
  EXPECT_FALSE(answer_matches("8", {"7", "seven"}));
  EXPECT_FALSE(answer_matches("3.91", {"391"}));
  EXPECT_FALSE(answer_matches("The answer is 391.", {"391"}));
  EXPECT_FALSE(answer_matches("", {"391"}));
}

TEST(AnswerMatch, ReasoningMarkers) {
  EXPECT_EQ(find_reasoning_marker("Paris"), "");
  EXPECT_EQ(find_reasoning_marker("<think>hm</think>Paris"), "<think>");
  EXPECT_EQ(find_reasoning_marker("hm</think>Paris"), "</think>");
  EXPECT_EQ(find_reasoning_marker("<|channel>thought\nx<channel|>Paris"), "<|channel>");
  EXPECT_EQ(find_reasoning_marker("x<channel|>Paris"), "<channel|>");
  EXPECT_EQ(find_reasoning_marker("[THINK]x[/THINK]Paris"), "[THINK]");
  EXPECT_EQ(find_reasoning_marker("<THINK>Paris"), "<think>");
}

// ---- case verdicts ----

GoldenCase tokyo_case() {
  GoldenCase c;
  c.id = "capital-japan";
  c.messages = json::array({{{"role", "user"}, {"content", "Capital of Japan?"}}});
  c.accept = {"Tokyo"};
  return c;
}

Reply ok_reply(const std::string& content) {
  Reply r;
  r.status = Reply::Status::Ok;
  r.http_status = 200;
  r.content = content;
  return r;
}

TEST(CoherenceEvaluate, Verdicts) {
  GoldenCase c = tokyo_case();
  EXPECT_TRUE(evaluate_case(c, ok_reply("Tokyo.")).pass);
  EXPECT_EQ(evaluate_case(c, ok_reply("Tokyo.")).kind, "pass");
  EXPECT_EQ(evaluate_case(c, ok_reply("Kyoto")).kind, "wrong");
  EXPECT_EQ(evaluate_case(c, ok_reply("<think>easy</think>Tokyo")).kind, "thinking_leak");
  EXPECT_EQ(evaluate_case(c, ok_reply("Tokyo Tokyo Tokyo Tokyo")).kind, "garbage");
  EXPECT_EQ(evaluate_case(c, ok_reply("Tokyo東京")).kind, "garbage");
  EXPECT_EQ(evaluate_case(c, ok_reply("")).kind, "garbage");
  Reply slow;
  slow.status = Reply::Status::Timeout;
  slow.error = "no answer within 5 s";
  EXPECT_EQ(evaluate_case(c, slow).kind, "timeout");
  Reply err;
  err.status = Reply::Status::HttpError;
  err.http_status = 500;
  err.error = "boom";
  const CaseResult r = evaluate_case(c, err);
  EXPECT_EQ(r.kind, "http_error");
  EXPECT_EQ(r.reason, "HTTP 500: boom");
  c.reject = {"kyoto"};
  EXPECT_EQ(evaluate_case(c, ok_reply("Tokyo")).kind, "pass");
  c.accept.clear();
  c.contains = {"tokyo"};
  EXPECT_EQ(evaluate_case(c, ok_reply("The capital is Tokyo, not Kyoto.")).kind, "rejected");
  EXPECT_EQ(evaluate_case(c, ok_reply("The capital is Tokyo.")).kind, "pass");
  EXPECT_EQ(evaluate_case(c, ok_reply("The capital is Osaka.")).kind, "missing");
}

TEST(CoherenceReport, LinesAndJson) {
  EXPECT_EQ(one_line("a\nb\t\"c\"\x01", 100), "a\\nb\\t\\\"c\\\"\\u0001");
  EXPECT_EQ(one_line("東京東京", 4), "東...");  // never half a character
  EXPECT_EQ(one_line("東京東京", 6), "東京...");
  CaseResult pass = evaluate_case(tokyo_case(), ok_reply("Tokyo"));
  pass.reply.latency_s = 0.25;
  EXPECT_EQ(case_line(pass), "PASS capital-japan  0.25 s  \"Tokyo\"");
  CaseResult fail = evaluate_case(tokyo_case(), ok_reply("Kyoto"));
  fail.reply.finish_reason = "length";
  EXPECT_EQ(case_line(fail),
            "FAIL capital-japan  0.00 s  \"Kyoto\" (cut at max_tokens)  wrong: expected 'Tokyo'");
  const RunInfo info{"seed", "built-in", "http://127.0.0.1:1", "m"};
  EXPECT_EQ(summary_line(info, {pass, fail}),
            "coherence: 1 of 2 passed, 1 failed (set seed, model m, http://127.0.0.1:1)");
  const json j = json_report(info, {pass, fail});
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["passed"], 1);
  EXPECT_EQ(j["cases"][1]["kind"], "wrong");
  EXPECT_EQ(j["cases"][1]["finish_reason"], "length");
}

// ---- golden sets ----

TEST(GoldenSet, TheSeedSetIsBuiltIn) {
  const GoldenSet s = load_golden_set("seed");
  EXPECT_EQ(s.name, "seed");
  ASSERT_EQ(s.cases.size(), 6u);
  std::vector<std::string> ids;
  for (const GoldenCase& c : s.cases) ids.push_back(c.id);
  EXPECT_EQ(ids[0], "capital-japan");
  EXPECT_EQ(s.cases[1].accept, std::vector<std::string>{"391"});
  EXPECT_EQ(s.cases[3].accept, (std::vector<std::string>{"7", "seven"}));
  // The same file, loaded by path.
  const GoldenSet f = load_golden_set(source_dir() + "/coherence/seed.json");
  EXPECT_EQ(f.cases.size(), s.cases.size());
  EXPECT_THROW(load_golden_set("no-such-set"), Error);
  EXPECT_THROW(load_golden_set("/no/such/file.json"), Error);
}

TEST(GoldenSet, BadSetsAreRefused) {
  const char* bad[] = {
      R"({"cases": []})",
      R"({"cases": [{"messages": [{"role": "user", "content": "x"}], "accept": ["y"]}]})",
      R"({"cases": [{"id": "a", "accept": ["y"]}]})",
      R"({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}]}]})",
      R"({"cases": [{"id": "a", "messages": [], "accept": ["y"]}]})",
      R"({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}], "accepts": ["y"]}]})",
      R"({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}], "accept": [1]}]})",
      R"({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}], "accept": "y",
          "max_tokens": 0}]})",
      R"({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}], "accept": "y"},
                    {"id": "a", "messages": [{"role": "user", "content": "x"}], "accept": "y"}]})",
  };
  for (const char* b : bad) EXPECT_THROW(parse_golden_set(json::parse(b), "", "t"), Error) << b;
}

TEST(GoldenSet, ImageFilesBecomeDataUrls) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/img");
  std::filesystem::copy_file(vision_fixture_dir("gemma4") + "/input_0.png",
                             dir.path() + "/img/picture.png");
  std::ofstream(dir.path() + "/set.json") << R"({"name": "pics", "cases": [{"id": "pic",
    "messages": [{"role": "user", "content": [
      {"type": "image_file", "path": "img/picture.png"},
      {"type": "text", "text": "What colour is it?"}]}],
    "accept": ["red"], "max_tokens": 8}]})";
  const GoldenSet s = load_golden_set(dir.path() + "/set.json");
  ASSERT_EQ(s.cases.size(), 1u);
  const json& part = s.cases[0].messages[0]["content"][0];
  EXPECT_EQ(part["type"], "image_url");
  const std::string url = part["image_url"]["url"].get<std::string>();
  EXPECT_EQ(url.rfind("data:image/png;base64,", 0), 0u);
  EXPECT_EQ(url.substr(22), base64(file_bytes(dir.path() + "/img/picture.png")));
  EXPECT_EQ(s.cases[0].max_tokens, 8);
  // A built-in set (no folder) cannot reference files.
  std::ifstream in(dir.path() + "/set.json");
  EXPECT_THROW(parse_golden_set(json::parse(in), "", "built-in"), Error);
}

// ---- end to end: `tandem coherence` against live servers ----

// A one-case set asking for Japan's capital.
std::string write_tokyo_set(const TempDir& dir, int max_tokens = 16) {
  const std::string path = dir.path() + "/tokyo.json";
  std::ofstream(path) << R"({"name": "tokyo", "cases": [{"id": "capital-japan",
    "messages": [{"role": "user", "content": "What is the capital of Japan?"}],
    "accept": ["Tokyo"], "max_tokens": )"
                      << max_tokens << "}]}";
  return path;
}

TEST(CoherenceCommand, PassesWhenTheServerAnswersRight) {
  ForcedServer s("Tokyo");
  TempDir dir;
  CommandResult r = run_tandem("coherence --url " + s.url() + " --set " + write_tokyo_set(dir));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("PASS capital-japan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 of 1 passed"), std::string::npos) << r.out;

  // The seed set: Tokyo is right once and wrong five times.
  r = run_tandem("coherence --url " + s.url() + "/v1 --json");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const json report = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << r.out;
  EXPECT_EQ(report["set"], "seed");
  EXPECT_EQ(report["ok"], false);
  EXPECT_EQ(report["total"], 6);
  EXPECT_EQ(report["passed"], 1);
  EXPECT_EQ(report["cases"][0]["id"], "capital-japan");
  EXPECT_EQ(report["cases"][0]["pass"], true);
  EXPECT_EQ(report["cases"][0]["answer"], "Tokyo");
  EXPECT_EQ(report["cases"][1]["kind"], "wrong");
}

TEST(CoherenceCommand, FailsOnGarbage) {
  ForcedServer s("banana banana banana banana banana");
  TempDir dir;
  const CommandResult r =
      run_tandem("coherence --url " + s.url() + " --set " + write_tokyo_set(dir, 64));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("FAIL capital-japan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("garbage: 'banana' repeated 5 times in a row"), std::string::npos) << r.out;
}

TEST(CoherenceCommand, FailsOnAThinkingLeak) {
  ForcedServer s("</think>Tokyo");
  TempDir dir;
  const CommandResult r =
      run_tandem("coherence --url " + s.url() + " --set " + write_tokyo_set(dir));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("thinking_leak"), std::string::npos) << r.out;
}

TEST(CoherenceCommand, NothingListeningExitsTwo) {
  // A port that was free a moment ago.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  const double t0 = now_s();
  CommandResult r = run_tandem("coherence --url http://127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("cannot reach"), std::string::npos) << r.err;
  EXPECT_LT(now_s() - t0, 15.0);
  r = run_tandem("coherence --json --url http://127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(json::parse(r.out, nullptr, false).value("ok", true), false) << r.out;
}

TEST(CoherenceCommand, AFailingStepFailsTheCaseWithoutAHang) {
  ForcedServer s("Tokyo", "step-throw@1");
  TempDir dir;
  const double t0 = now_s();
  const CommandResult r =
      run_tandem("coherence --timeout 20 --url " + s.url() + " --set " + write_tokyo_set(dir));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("FAIL capital-japan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("http_error: HTTP 500"), std::string::npos) << r.out;
  EXPECT_LT(now_s() - t0, 20.0);
}

TEST(CoherenceCommand, AStalledServerIsATimeoutNotAWait) {
  // The step blocks until the watchdog (60 s, far beyond --timeout) fires.
  ForcedServer s("Tokyo", "step-stall@1");
  TempDir dir;
  const double t0 = now_s();
  const CommandResult r =
      run_tandem("coherence --timeout 2 --url " + s.url() + " --set " + write_tokyo_set(dir));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("timeout: no answer within 2 s"), std::string::npos) << r.out;
  EXPECT_LT(now_s() - t0, 12.0);
}

TEST(CoherenceCommand, ServesAModelFolderItself) {
  TempDir dir;
  const std::string set = write_tokyo_set(dir);
  const std::string model = vision_model_dir("gemma4");
  setenv("TANDEM_FORCE_OUTPUT", "Tokyo", 1);
  CommandResult r =
      run_tandem("coherence " + model + " --set " + set + " -- --threads 1 --text-only");
  unsetenv("TANDEM_FORCE_OUTPUT");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("PASS capital-japan"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("starting tandem serve"), std::string::npos) << r.err;

  // A step that throws in the served child: the case fails, nothing hangs.
  setenv("TANDEM_FORCE_OUTPUT", "Tokyo", 1);
  setenv("TANDEM_FAULT", "step-throw@1", 1);
  const double t0 = now_s();
  r = run_tandem("coherence --timeout 20 " + model + " --set " + set + " -- --threads 1");
  unsetenv("TANDEM_FAULT");
  unsetenv("TANDEM_FORCE_OUTPUT");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("http_error: HTTP 500"), std::string::npos) << r.out;
  EXPECT_LT(now_s() - t0, 40.0);

  // A case with an image file goes through the vision lane as a data URL.
  std::filesystem::create_directories(dir.path() + "/img");
  std::filesystem::copy_file(vision_fixture_dir("gemma4") + "/input_0.png",
                             dir.path() + "/img/picture.png");
  std::ofstream(dir.path() + "/pic.json") << R"({"name": "pic", "cases": [{"id": "picture",
    "messages": [{"role": "user", "content": [
      {"type": "image_file", "path": "img/picture.png"},
      {"type": "text", "text": "What colour is it? One word."}]}],
    "accept": ["red"], "max_tokens": 8}]})";
  setenv("TANDEM_FORCE_OUTPUT", "Red.", 1);
  r = run_tandem("coherence " + model + " --set " + dir.path() + "/pic.json -- --threads 1");
  unsetenv("TANDEM_FORCE_OUTPUT");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("PASS picture"), std::string::npos) << r.out;

  // A folder that is no model: the child exits, coherence says why, status 2.
  TempDir empty;
  r = run_tandem("coherence " + empty.path() + " --set " + set);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("before it was ready"), std::string::npos) << r.err;

  // The command picks the port itself.
  r = run_tandem("coherence " + model + " -- --port 9");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--port"), std::string::npos) << r.err;
}

}  // namespace
