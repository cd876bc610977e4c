// Vision towers from llama.cpp mmproj GGUFs (model/gguf_mmproj.h): the tiny
// Gemma 3 fixture's tower written as an mmproj (tests/gguf_mmproj_writer.cpp)
// and its language model as a text GGUF give the safetensors checkpoint's
// image logits; other tensor types stay close to the f32 tower; malformed
// files and unsupported combinations fail naming the file and the key or
// tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf_writer.h"
#include "model/image_prompt.h"
#include "model/model.h"
#include "model/vision_tower.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;
namespace {

// The fixture's vocabulary as GGUF token strings: placeholders, and the
// Gemma 3 image tokens at the ids config.json gives them.
std::vector<std::string> gemma3_tokens() {
  std::vector<std::string> t;
  for (int i = 0; i < 320; ++i) t.push_back("<t" + std::to_string(i) + ">");
  t[317] = "<start_of_image>";
  t[318] = "<end_of_image>";
  t[319] = "<image_soft_token>";
  return t;
}

// The Gemma 3 fixture as a text GGUF (with image tokens) in `dir`.
std::string gemma3_text_gguf(const std::string& dir, bool with_tokens = true) {
  const std::string path = dir + (with_tokens ? "/gemma3.gguf" : "/gemma3-notok.gguf");
  auto st = load_model(fixture_dir("gemma3-f32"));
  write_model_gguf(*st, path, GgmlType::F32, GgmlType::F32, "",
                   with_tokens ? gemma3_tokens() : std::vector<std::string>{});
  return path;
}

std::string mmproj(const std::string& dir, GgmlType type, const std::string& skip = "",
                   const std::string& projector = "gemma3") {
  const std::string path = dir + "/mmproj-" + ggml_type_name(type) + skip + projector + ".gguf";
  write_mmproj_gguf(fixture_dir("gemma3-f32"), path, type, skip, projector);
  return path;
}

std::string ids_arg(const json& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i].get<int>());
  return s;
}

double json_std(const json& rows) {
  double sum = 0, sum2 = 0, n = 0;
  for (const json& r : rows)
    for (const json& v : r) sum += v.get<double>(), sum2 += v.get<double>() * v.get<double>(), ++n;
  return std::sqrt(sum2 / n - (sum / n) * (sum / n));
}

double json_max_diff(const json& a, const json& b) {
  double m = 0;
  for (size_t r = 0; r < b.size(); ++r)
    for (size_t v = 0; v < b[r].size(); ++v)
      m = std::max(m, std::fabs(a[r][v].get<double>() - b[r][v].get<double>()));
  return m;
}

// For each case of the `family` vision fixture (image cases only when
// `images_only`): `tandem logits` of `model` with --mmproj `mm` against the
// safetensors `checkpoint` (bound 1e-6 of the logits' std) and transformers'
// reference (1e-3, as test_vision_parity). `label` names the printed lines.
void expect_mmproj_logits(const std::string& family, const std::string& model,
                          const std::string& mm, const std::string& checkpoint, bool images_only,
                          const std::string& label) {
  std::ifstream f(vision_fixture_dir(family) + "/reference.json");
  const json ref = json::parse(f);
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const json& c : ref["cases"]) {
    if (images_only && c["images"].empty()) continue;
    std::string args = " --all --ids " + ids_arg(c["ids"]);
    for (const json& k : c["images"])
      args += " --image " + vision_fixture_dir(family) + "/input_" + std::to_string(k.get<int>()) +
              ".png";
    const auto a = run_tandem("logits " + model + " --mmproj " + mm + args);
    const auto b = run_tandem("logits " + checkpoint + args);
    ASSERT_EQ(a.exit_code, 0) << c["name"] << ": " << a.err;
    ASSERT_EQ(b.exit_code, 0) << c["name"] << ": " << b.err;
    const json got = json::parse(a.out)["logits"], st = json::parse(b.out)["logits"];
    ASSERT_EQ(got.size(), c["logits"].size());
    const double s = json_std(c["logits"]), d_st = json_max_diff(got, st),
                 d_ref = json_max_diff(got, c["logits"]);
    EXPECT_LE(d_st, 1e-6 * s) << label << " " << c["name"];
    EXPECT_LE(d_ref, 1e-3 * s) << label << " " << c["name"];
    std::printf("[mmproj] %s %-10s vs safetensors %.2e, vs transformers %.2e x std\n",
                label.c_str(), c["name"].get<std::string>().c_str(), d_st / s, d_ref / s);
  }
}

// `tandem logits` with the text GGUF and an F32 mmproj equals the
// safetensors checkpoint (bound 1e-6 of the logits' std; measured: 0, the
// same weights through the same code) and transformers (1e-3, as
// test_vision_parity), for a text prompt, one image and two images.
TEST(GgufMmproj, Gemma3ImageLogitsMatchTheCheckpoint) {
  TempDir tmp;
  const std::string text = gemma3_text_gguf(tmp.path()), mm = mmproj(tmp.path(), GgmlType::F32);
  expect_mmproj_logits("gemma3", text, mm, fixture_dir("gemma3-f32"), false, "gemma3");
}

// Mistral 3: the safetensors checkpoint with its tower from a pixtral mmproj
// (q/k rows permuted as llama.cpp writes them) gives the checkpoint's own
// logits (bound 1e-6 of the std) and transformers' (1e-3).
TEST(GgufMmproj, PixtralImageLogitsMatchTheCheckpoint) {
  TempDir tmp;
  const std::string mm = tmp.path() + "/mmproj-pixtral.gguf";
  write_mmproj_gguf(fixture_dir("mistral3-f32"), mm, GgmlType::F32);
  const std::string checkpoint = fixture_dir("mistral3-f32");
  expect_mmproj_logits("mistral3", checkpoint, mm, checkpoint, true, "pixtral");
  // The pair llama.cpp users have: a mistral3 text GGUF (written from the
  // same checkpoint, [IMG] / [IMG_BREAK] / [IMG_END] at the checkpoint's ids)
  // with the pixtral mmproj gives the checkpoint's logits too.
  std::vector<std::string> tokens;
  for (int i = 0; i < 320; ++i) tokens.push_back("<t" + std::to_string(i) + ">");
  tokens[10] = "[IMG]";
  tokens[12] = "[IMG_BREAK]";
  tokens[13] = "[IMG_END]";
  const std::string text_gguf = tmp.path() + "/ministral3.gguf";
  write_model_gguf(*load_model(checkpoint), text_gguf, GgmlType::F32, GgmlType::F32, "", tokens);
  expect_mmproj_logits("mistral3", text_gguf, mm, checkpoint, true, "mistral3 GGUF + pixtral");
  // A Gemma 3 text model cannot take a pixtral tower.
  auto g = load_model(gemma3_text_gguf(tmp.path()));
  g->mmproj = mm;
  const std::string e = error_of([&] { VisionTower::load(*g); });
  EXPECT_NE(e.find("projector type pixtral needs a Mistral 3"), std::string::npos) << e;
}

// The soft tokens of image 0 from the tower of `m` (its mmproj when set).
std::vector<float> soft_tokens(const Model& m) {
  auto tower = VisionTower::load(m);
  ThreadPool pool(2);
  const PreparedImage img =
      tower->prepare(read_image_file(vision_fixture_dir("gemma3") + "/input_0.png"));
  std::vector<float> out(size_t(img.tokens * tower->text_hidden()));
  tower->encode(pool, img, out.data());
  EXPECT_EQ(tower->ids().begin, 317);
  EXPECT_EQ(tower->ids().end, 318);
  EXPECT_EQ(tower->ids().placeholder, 319);
  EXPECT_TRUE(tower->bidirectional());
  return out;
}

// F16, BF16 and Q8_0 mmprojs: the soft tokens against the f32 checkpoint's,
// relative to their std (the rounding of the weights; bounds a few times the
// measured values, printed).
TEST(GgufMmproj, OtherTensorTypesStayCloseToF32) {
  TempDir tmp;
  const std::string text = gemma3_text_gguf(tmp.path());
  const auto st = load_model(fixture_dir("gemma3-f32"));
  const std::vector<float> want = soft_tokens(*st);
  const double s = stddev(want);
  for (auto [type, bound] : {std::pair{GgmlType::F32, 0.0}, std::pair{GgmlType::F16, 5e-3},
                             std::pair{GgmlType::BF16, 3e-2}, std::pair{GgmlType::Q8_0, 5e-2}}) {
    auto m = load_model(text);
    m->mmproj = mmproj(tmp.path(), type);
    const double d = max_abs_diff(soft_tokens(*m), want) / s;
    EXPECT_LE(d, bound) << ggml_type_name(type);
    std::printf("[mmproj] gemma3 %-4s soft tokens max|delta| = %.2e x std\n", ggml_type_name(type),
                d);
  }
}

TEST(GgufMmproj, MalformedFilesFailNamingFileAndKey) {
  TempDir tmp;
  const std::string text = gemma3_text_gguf(tmp.path());
  auto m = load_model(text);
  auto load_error = [&](const std::string& mm) {
    m->mmproj = mm;
    return error_of([&] { VisionTower::load(*m); });
  };
  const std::string missing = mmproj(tmp.path(), GgmlType::F32, "v.blk.0.attn_q.weight");
  std::string e = load_error(missing);
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("missing tensor \"v.blk.0.attn_q.weight\""), std::string::npos) << e;

  const std::string llava = mmproj(tmp.path(), GgmlType::F32, "", "mlp");
  e = load_error(llava);
  EXPECT_NE(e.find(llava), std::string::npos) << e;
  EXPECT_NE(e.find("clip.projector_type \"mlp\" is not supported"), std::string::npos) << e;

  e = load_error(text);  // a text model given as the mmproj
  EXPECT_NE(e.find("\"clip.projector_type\" is missing"), std::string::npos) << e;

  GgufWriter g;  // a projector type without its keys
  g.str("clip.projector_type", "gemma3");
  g.write(tmp.path() + "/bare.gguf");
  e = load_error(tmp.path() + "/bare.gguf");
  EXPECT_NE(e.find("\"clip.vision.embedding_length\" is missing"), std::string::npos) << e;

  // The text model must carry the image tokens, and be a Gemma 3.
  auto notok = load_model(gemma3_text_gguf(tmp.path(), false));
  notok->mmproj = mmproj(tmp.path(), GgmlType::F32);
  e = error_of([&] { VisionTower::load(*notok); });
  EXPECT_NE(e.find("tokenizer.ggml.tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("<image_soft_token>"), std::string::npos) << e;
  const std::string qwen = tmp.path() + "/qwen3.gguf";
  write_model_gguf(*load_model(fixture_dir("qwen3-f32")), qwen, GgmlType::F32, GgmlType::F32);
  auto q = load_model(qwen);
  q->mmproj = notok->mmproj;
  e = error_of([&] { VisionTower::load(*q); });
  EXPECT_NE(e.find("needs a Gemma 3 text model, not qwen3"), std::string::npos) << e;
}

// `tandem chat` takes --mmproj like run/logits/serve: the Gemma 3 demo model
// (it has a tokenizer and chat template) with its own tower as an mmproj;
// the session ends at once (stdin is empty).
TEST(GgufMmproj, ChatLoadsTheTowerFromAnMmproj) {
  TempDir tmp;
  const std::string demo = source_dir() + "/models/gemma3-demo", mm = tmp.path() + "/mm.gguf";
  write_mmproj_gguf(demo, mm, GgmlType::F32);
  auto r = run_tandem("chat " + demo + " --device cpu --mmproj " + mm);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("vision tower loaded from " + mm), std::string::npos) << r.err;
  r = run_tandem("chat " + demo + " --mmproj " + tmp.path() + "/none.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no such file"), std::string::npos) << r.err;
}

TEST(GgufMmproj, CliErrors) {
  TempDir tmp;
  const std::string text = gemma3_text_gguf(tmp.path());
  const std::string image = " --image " + vision_fixture_dir("gemma3") + "/input_0.png";
  // Without --mmproj a GGUF model says how to give a tower.
  auto r = run_tandem("logits " + text + " --ids 2,317,319,318" + image);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--mmproj FILE"), std::string::npos) << r.err;
  r = run_tandem("logits " + text + " --ids 2 --mmproj " + tmp.path() + "/none.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--mmproj " + tmp.path() + "/none.gguf: no such file"), std::string::npos)
      << r.err;
  const std::string bad = mmproj(tmp.path(), GgmlType::F32, "mm.soft_emb_norm.weight");
  r = run_tandem("run " + text + " --ids 2,317,319,318 -n 1 --mmproj " + bad + image);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing tensor \"mm.soft_emb_norm.weight\""), std::string::npos) << r.err;
  // The same through `run`: the image's greedy token as `logits` gives it.
  r = run_tandem("run " + text + " --ids 2,317,319,318 -n 1 --json --ignore-eos --mmproj " +
                 mmproj(tmp.path(), GgmlType::F32) + image);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// `tandem serve --mmproj`: the one-image chat of prompts.json through the
// server, its tower from the mmproj, continues with transformers' argmax.
TEST(GgufMmproj, ServeTakesImagesThroughTheMmproj) {
  TempDir tmp;
  const std::string mm = mmproj(tmp.path(), GgmlType::F32);
  ChildServer srv({vision_model_dir("gemma3"), "--threads", "1", "--mmproj", mm});
  ASSERT_TRUE(srv.ready()) << srv.log();
  EXPECT_NE(srv.log().find("vision tower loaded from " + mm), std::string::npos) << srv.log();
  std::ifstream f(vision_fixture_dir("gemma3") + "/prompts.json");
  const json c = json::parse(f)["cases"][1];
  json messages = c["messages"];
  for (json& part : messages[0]["content"])
    if (part["type"] == "image_url")
      part["image_url"]["url"] = "data:image/png;base64," +
                                 base64(file_bytes(vision_fixture_dir("gemma3") + "/" +
                                                   part["image_url"]["url"].get<std::string>()));
  const auto r = post_json(srv.port(), "/v1/chat/completions",
                           {{"messages", messages}, {"max_tokens", 1}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::vector<double> last = c["logits_last"].get<std::vector<double>>();
  const auto best = std::max_element(last.begin(), last.end()) - last.begin();
  ASSERT_EQ(r.body["choices"][0]["token_ids"].size(), 1u) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["token_ids"][0].get<int64_t>(), int64_t(best)) << r.raw;
}

}  // namespace
