// GGUF checkpoints end to end: every architecture fixture written as a GGUF
// file (llama.cpp's names, Q/K permutation, Gemma 1+w norms, Llama 3
// rope_freqs) and loaded back against the safetensors model; quantized
// types against the same model with the dequantized weights; the tokenizer
// from GGUF metadata against tokenizer.json; the CLI on a .gguf path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf_writer.h"
#include "model/decoder.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "server/model_text.h"
#include "test_util.h"
#include "text/tokenizer.h"

using namespace tandem;
using namespace tandem::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::vector<int32_t> kIds = {144, 31,  102, 78,  270, 261, 176,
                                   226, 125, 65,  159, 141, 19,  179};

std::vector<float> all_logits(const Model& m) {
  ThreadPool pool(2);
  const int64_t n = int64_t(kIds.size());
  KvPool kv = single_sequence_pool(m.spec, n, Decoder::kDefaultStepTokens);
  Decoder d(m, pool, kv);
  SequenceKv s;
  std::vector<float> out(size_t(n * m.spec.vocab));
  run_sequence(d, kIds.data(), n, s, out.data(), true);
  return out;
}

struct ReferenceGuard {  // exact f32 activations for quantized matmuls
  ReferenceGuard() { cpu::set_quant_reference_for_testing(true); }
  ~ReferenceGuard() { cpu::set_quant_reference_for_testing(false); }
};

// The model with every matrix replaced by its values in the GGUF file at
// `path` (dequantized to f32) — the reference for quantized GGUF types.
void dequantized_reference(Model& ref, const Model& gguf) {
  auto replace = [&](WeightMatrix& dst, const WeightMatrix& src) {
    if (src.rows == 0) return;  // none (a KV-shared layer's k/v)
    std::vector<float> v = test::matrix_values(src);
    ref.owned.push_back(allocate_owned(v.size() * 4));
    std::memcpy(ref.owned.back().get(), v.data(), v.size() * 4);
    dst = WeightMatrix{};
    dst.dtype = DType::F32;
    dst.rows = src.rows;
    dst.cols = src.cols;
    dst.data = ref.owned.back().get();
  };
  Weights& w = ref.weights;
  replace(w.embed, gguf.weights.embed);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    const LayerWeights& g = gguf.weights.layers[i];
    for (auto [d, s] : {std::pair{&l.q, &g.q},
                        {&l.k, &g.k},
                        {&l.v, &g.v},
                        {&l.o, &g.o},
                        {&l.gate, &g.gate},
                        {&l.up, &g.up},
                        {&l.down, &g.down},
                        {&l.ple_gate, &g.ple_gate},
                        {&l.ple_proj, &g.ple_proj}})
      replace(*d, *s);
  }
  replace(w.ple_embed, gguf.weights.ple_embed);
  replace(w.ple_model_proj, gguf.weights.ple_model_proj);
  w.ple_embed_scale = gguf.weights.ple_embed_scale;
  if (ref.spec.tied_embeddings)
    w.head = w.embed;
  else
    replace(w.head, gguf.weights.head);
  w.embed_scale = gguf.weights.embed_scale;
}

// ---- Dense types: same logits as the safetensors model ----------------------------

class GgufFixture : public ::testing::TestWithParam<std::string> {};

// F32 / BF16 GGUFs hold exactly the fixture's values: the logits agree to
// 1e-5 of their spread (measured: identical for every fixture, llama's Llama 3
// RoPE from rope_freqs divisors included).
TEST_P(GgufFixture, DenseMatchesSafetensors) {
  const std::string fixture = test::fixture_dir(GetParam());
  const bool bf16 = GetParam().find("bf16") != std::string::npos;
  auto st = load_model(fixture);
  test::TempDir tmp;
  const std::string path = tmp.path() + "/model.gguf";
  const GgmlType type = bf16 ? GgmlType::BF16 : GgmlType::F32;
  test::write_model_gguf(*st, path, type, type);
  auto gg = load_model(path);
  EXPECT_EQ(gg->spec.arch, st->spec.arch);
  EXPECT_EQ(gg->spec.attn_scale, st->spec.attn_scale);
  EXPECT_FALSE(gg->weights.layers[0].q.quantized());
  const auto want = all_logits(*st), got = all_logits(*gg);
  const double tol = 1e-5 * stddev(want);
  const double diff = max_abs_diff(want, got);
  std::printf("[gguf %s] max |Δ| = %.3g (%.3g of std)\n", GetParam().c_str(), diff,
              diff / stddev(want));
  EXPECT_LE(diff, tol) << GetParam();
}

// Q8_0 / Q4_0 (re-packed into the affine storage) against the same model with
// the dequantized weights, with exact f32 activations (the reference hook):
// 1e-5 of the spread (only the summation order differs; measured ≤ 3e-6).
// Gemma 4: 1e-4 (measured 4.7e-5 Q8_0, 2.0e-5 Q4_0). Why it differs more is
// not established; swapping any one group of matrices (attention, MLP, PLE)
// back to f32 moves it little, so no single tensor is mis-mapped.
// Matrices whose rows are not whole blocks (Gemma's hidden 80) stay F32.
TEST_P(GgufFixture, QuantizedMatchesDequantized) {
  const std::string fixture = test::fixture_dir(GetParam());
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    auto st = load_model(fixture);
    test::TempDir tmp;
    const std::string path = tmp.path() + "/model.gguf";
    test::write_model_gguf(*st, path, type, type);
    auto gg = load_model(path);
    if (st->spec.hidden % 32 == 0) {
      EXPECT_TRUE(gg->weights.layers[0].q.quantized());
      EXPECT_EQ(gg->weights.layers[0].q.bits, type == GgmlType::Q8_0 ? 8 : 4);
    }
    dequantized_reference(*st, *gg);
    ReferenceGuard exact;
    const auto want = all_logits(*st), got = all_logits(*gg);
    const double diff = max_abs_diff(want, got);
    std::printf("[gguf %s %s] max |Δ| = %.3g (%.3g of std)\n", GetParam().c_str(),
                ggml_type_name(type), diff, diff / stddev(want));
    const double tol = st->spec.arch == "gemma4_text" ? 1e-4 : 1e-5;
    EXPECT_LE(diff, tol * stddev(want)) << GetParam() << " " << ggml_type_name(type);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufFixture,
                         ::testing::Values("llama-f32", "llama-bf16", "qwen2-f32", "qwen3-f32",
                                           "qwen3-bf16", "gemma3_text-f32", "gemma3_text-bf16",
                                           "gemma4_text-f32", "gemma4_text-bf16", "ministral3-f32",
                                           "ministral3-bf16"),
                         [](const auto& info) { return test::fixture_param_name(info.param); });

// BF16 GGUFs loaded for the CPU (LoadOptions::pack_for_cpu): the layers'
// matrices are packed (llama's and ministral's per-head Q/K permutation
// first: the permuted copy is dropped once packed), embeddings stay dense,
// and the logits are the safetensors model's up to the summation order.
TEST(GgufPacked, Bf16LayersArePackedAndMatchSafetensors) {
  for (const char* name :
       {"llama-bf16", "qwen3-bf16", "gemma3_text-bf16", "gemma4_text-bf16", "ministral3-bf16"}) {
    auto st = load_model(test::fixture_dir(name));
    test::TempDir tmp;
    const std::string path = tmp.path() + "/model.gguf";
    test::write_model_gguf(*st, path, GgmlType::BF16, GgmlType::BF16);
    LoadOptions o;
    o.pack_for_cpu = true;
    auto gg = load_model(path, o);
    const LayerWeights& l = gg->weights.layers[0];
    for (const WeightMatrix* w : {&l.q, &l.k, &l.o, &l.gate, &l.up, &l.down})
      EXPECT_EQ(w->format, WeightFormat::PackedBf16) << name;
    EXPECT_EQ(gg->weights.embed.format, WeightFormat::Dense) << name;
    uint64_t packed_bytes = 0;
    for (const LayerWeights& layer : gg->weights.layers)
      for (const WeightMatrix* w : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up,
                                    &layer.down, &layer.ple_gate, &layer.ple_proj})
        if (w->format == WeightFormat::PackedBf16) packed_bytes += w->nbytes();
    if (gg->weights.ple_model_proj.format == WeightFormat::PackedBf16)
      packed_bytes += gg->weights.ple_model_proj.nbytes();
    // ... and the head, copied from the mapped file (keep_head_resident).
    EXPECT_EQ(gg->owned_bytes, packed_bytes + gg->weights.head.nbytes())
        << name << ": a converted copy was kept";
    const auto want = all_logits(*st), got = all_logits(*gg);
    const double tol = gg->spec.arch == "gemma4_text" ? 1e-4 : 1e-5;
    const double diff = max_abs_diff(want, got);
    std::printf("[gguf %s packed] max |Δ| = %.3g of std\n", name, diff / stddev(want));
    EXPECT_LE(diff, tol * stddev(want)) << name;
  }
}

// Q8_0 / Q4_0 GGUFs loaded for the CPU: where the packed int8 kernels run
// here the layers' affine copies are packed (PackedAffine) and dropped, and
// the logits are the unpacked GGUF's up to the order of the f32 additions.
TEST(GgufPacked, QuantizedLayersArePackedAndMatchUnpacked) {
  for (const char* name : {"llama-f32", "qwen3-f32", "gemma4_text-f32"})
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
      auto st = load_model(test::fixture_dir(name));
      test::TempDir tmp;
      const std::string path = tmp.path() + "/model.gguf";
      test::write_model_gguf(*st, path, type, type);
      auto plain = load_model(path);
      LoadOptions o;
      o.pack_for_cpu = true;
      auto gg = load_model(path, o);
      const std::string what = std::string(name) + " " + ggml_type_name(type);
      if (cpu::packed_affine_preferred(type == GgmlType::Q8_0 ? 8 : 4) &&
          st->spec.hidden % 32 == 0) {
        EXPECT_EQ(gg->weights.layers[0].q.format, WeightFormat::PackedAffine) << what;
        EXPECT_EQ(gg->weights.layers[0].gate.format, WeightFormat::PackedAffine) << what;
      }
      EXPECT_EQ(gg->owned_bytes, plain->owned_bytes + test::packed_affine_padding(*gg))
          << what << ": a converted copy was kept";
      // The int8 kernels add the same sums in another order: an activation's
      // rounding can tip (test_quant_model.cpp's LogitsMatchTheDequantizedModel
      // says how far that moves these fixtures); the dequantized rows are equal.
      const auto want = all_logits(*plain), got = all_logits(*gg);
      const double diff = max_abs_diff(want, got);
      std::printf("[gguf %s packed] max |Δ| = %.3g of std\n", what.c_str(), diff / stddev(want));
      EXPECT_LE(diff, 0.25 * stddev(want)) << what;
      ReferenceGuard exact;
      EXPECT_EQ(all_logits(*gg), all_logits(*plain)) << what;
    }
}

// Q4_K and Q6_K need rows of 256: a synthesized llama with hidden 256. Q4_K
// matrices go to the affine storage (F32 scales, lossless), the Q6_K head is
// re-quantized to 8 bits (the one lossy conversion; the reference takes the
// same values). Tolerance 1e-5 of the spread with exact activations
// (measured 1.8e-6); with the int8-activation kernels 0.1 of the spread
// (measured 0.046: activation rounding, as for MLX weights).
TEST(GgufKQuants, Q4KAndQ6KMatchDequantized) {
  test::TempDir tmp;
  const json config = {
      {"model_type", "llama"},    {"vocab_size", 320},      {"hidden_size", 256},
      {"intermediate_size", 512}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2}, {"head_dim", 64},         {"max_position_embeddings", 128},
      {"rms_norm_eps", 1e-5},     {"rope_theta", 10000.0},  {"tie_word_embeddings", false}};
  std::ofstream(tmp.path() + "/config.json") << config.dump();
  const std::string st_dir = tmp.path() + "/st";
  synth_checkpoint(tmp.path() + "/config.json", st_dir, DType::F32, 3);
  auto st = load_model(st_dir);
  const std::string path = tmp.path() + "/k.gguf";
  test::write_model_gguf(*st, path, GgmlType::Q4_K, GgmlType::Q6_K);
  auto gg = load_model(path);
  EXPECT_EQ(gg->weights.layers[0].down.format, WeightFormat::Affine);
  EXPECT_EQ(gg->weights.layers[0].down.dtype, DType::F32);
  EXPECT_EQ(gg->weights.head.format, WeightFormat::Affine);
  EXPECT_EQ(gg->weights.head.bits, 8);
  dequantized_reference(*st, *gg);
  const auto fast = all_logits(*gg);
  ReferenceGuard exact;
  const auto want = all_logits(*st), got = all_logits(*gg);
  const double diff = max_abs_diff(want, got), sd = stddev(want);
  std::printf("[gguf Q4_K/Q6_K] exact activations: %.3g of std; int8 activations: %.3g of std\n",
              diff / sd, max_abs_diff(want, fast) / sd);
  EXPECT_LE(diff, 1e-5 * sd);
  EXPECT_LE(max_abs_diff(want, fast), 0.1 * sd);
}

// The error loading `m` written as an F32 GGUF at `path` without the tensor
// or metadata key `skip` ("" when it loads).
std::string error_without(const Model& m, const std::string& path, const std::string& skip) {
  test::write_model_gguf(m, path, GgmlType::F32, GgmlType::F32, skip);
  try {
    load_model(path);
  } catch (const Error& x) {
    return x.what();
  }
  return "";
}

// A missing tensor names the file and the tensor.
TEST(GgufModelErrors, MissingTensors) {
  auto st = load_model(test::fixture_dir("qwen3-f32"));
  test::TempDir tmp;
  const std::string path = tmp.path() + "/m.gguf";
  for (const std::string name : {"blk.1.ffn_up.weight", "blk.0.attn_q_norm.weight"}) {
    const std::string e = error_without(*st, path, name);
    EXPECT_NE(e.find(path + ": missing tensor \"" + name + "\""), std::string::npos) << e;
  }
}

// Gemma 4 and Ministral 3: a missing required key or tensor names it; the
// spec read from the metadata is the safetensors one, layer by layer.
TEST(GgufModelErrors, Gemma4AndMinistral3) {
  for (const auto& [fixture, names] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"gemma4_text-f32",
            {"gemma4.attention.key_length_swa", "gemma4.attention.sliding_window_pattern",
             "gemma4.embedding_length_per_layer_input", "gemma4.feed_forward_length",
             "blk.3.attn_k.weight", "blk.5.inp_gate.weight", "per_layer_token_embd.weight"}},
           {"ministral3-f32", {"mistral3.rope.scaling.original_context_length"}}}) {
    auto st = load_model(test::fixture_dir(fixture));
    test::TempDir tmp;
    const std::string path = tmp.path() + "/m.gguf";
    test::write_model_gguf(*st, path, GgmlType::F32, GgmlType::F32);
    const ModelSpec s = load_model(path)->spec;
    ASSERT_EQ(s.layer.size(), st->spec.layer.size());
    for (size_t i = 0; i < s.layer.size(); ++i) {
      const LayerSpec &a = s.layer[i], &b = st->spec.layer[i];
      EXPECT_TRUE(a.kind == b.kind && a.head_dim == b.head_dim && a.kv_heads == b.kv_heads &&
                  a.intermediate == b.intermediate && a.kv_source == b.kv_source &&
                  a.k_eq_v == b.k_eq_v)
          << fixture << " layer " << i;
    }
    EXPECT_EQ(s.query_temperature_beta, st->spec.query_temperature_beta);
    EXPECT_EQ(s.query_temperature_base, st->spec.query_temperature_base);
    EXPECT_EQ(s.ple_dim, st->spec.ple_dim);
    for (const std::string& name : names) {
      const std::string e = error_without(*st, path, name);
      EXPECT_NE(e.find("\"" + name + "\""), std::string::npos) << name << ": " << e;
    }
  }
}

// --quantize q8 on a GGUF model quantizes its dense matrices at load.
TEST(GgufModelErrors, QuantizeAtLoad) {
  auto st = load_model(test::fixture_dir("qwen3-f32"));
  test::TempDir tmp;
  const std::string path = tmp.path() + "/m.gguf";
  test::write_model_gguf(*st, path, GgmlType::F32, GgmlType::F32);
  LoadOptions o;
  o.quantize_bits = 8;
  o.quantize_group_size = 32;
  auto q = load_model(path, o);
  EXPECT_EQ(q->weights.layers[0].q.format, WeightFormat::Affine);
  EXPECT_EQ(q->weights.layers[0].q.bits, 8);
}

// ---- Tokenizer from GGUF metadata ---------------------------------------------------

std::string tokenizer_cache(const std::string& name) {
  const char* c = std::getenv("TANDEM_CACHE");
  const char* home = std::getenv("HOME");
  const std::string root =
      c && *c ? std::string(c) : std::string(home ? home : "") + "/.cache/tandem";
  return root + "/tokenizers/" + name;
}

// Writes the metadata llama.cpp's converter would write for a tokenizer.json
// folder: tokens by id, token types, merges, pre, special ids, add_bos.
void write_tokenizer_gguf(const std::string& dir, const std::string& pre, const std::string& path) {
  json tj, cfg;
  std::ifstream(dir + "/tokenizer.json") >> tj;
  std::ifstream(dir + "/tokenizer_config.json") >> cfg;
  const text::Tokenizer ref = text::Tokenizer::load(dir);
  std::vector<std::string> tokens(size_t(ref.vocab_size()));
  std::vector<int32_t> types(tokens.size(), 1);
  for (auto it = tj["model"]["vocab"].begin(); it != tj["model"]["vocab"].end(); ++it)
    tokens[size_t(it.value().get<int32_t>())] = it.key();
  for (const json& a : tj["added_tokens"]) {
    const size_t id = a["id"].get<size_t>();
    tokens[id] = a["content"].get<std::string>();
    types[id] = ref.is_special(int32_t(id)) ? 3 : 4;  // control: skipped by decode
  }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i].empty()) tokens[i] = "[PAD" + std::to_string(i) + "]";
  std::vector<std::string> merges;
  for (const json& m : tj["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m[0].get<std::string>() + " " + m[1].get<std::string>());
  test::GgufWriter g;
  if (pre == "spm") {
    // SentencePiece (Gemma): scores instead of merges — 0 for added pieces,
    // decreasing with the id otherwise, as Gemma's tokenizer.model has them;
    // byte pieces <0xNN> have type 6.
    std::vector<float> scores(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = types[i] == 1 ? -float(i) : 0.0f;
      if (types[i] == 1 && tokens[i].size() == 6 && tokens[i].rfind("<0x", 0) == 0) types[i] = 6;
    }
    g.str("general.architecture", "gemma3");
    g.str("tokenizer.ggml.model", "llama");
    g.str_array("tokenizer.ggml.tokens", tokens);
    g.f32_array("tokenizer.ggml.scores", scores);
    g.i32_array("tokenizer.ggml.token_type", types);
    g.boolean("tokenizer.ggml.add_space_prefix", false);
  } else if (pre == "gemma4") {
    // Gemma 4 (llama.cpp's Gemma4Model.set_vocab): tokens by id, byte pieces
    // <0xNN> type 6, the chat tokens it renders user-defined (4), merges
    // "left right", add_space_prefix false.
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] == 1 && tokens[i].size() == 6 && tokens[i].rfind("<0x", 0) == 0) types[i] = 6;
      for (const char* v : {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                            "<|tool_response>", "<tool_response|>", "<|\"|>"})
        if (tokens[i] == v) types[i] = 4;
    }
    g.str("general.architecture", "gemma4");
    g.str("tokenizer.ggml.model", "gemma4");
    g.str_array("tokenizer.ggml.tokens", tokens);
    g.f32_array("tokenizer.ggml.scores", std::vector<float>(tokens.size(), 0.0f));
    g.i32_array("tokenizer.ggml.token_type", types);
    g.str_array("tokenizer.ggml.merges", merges);
    g.boolean("tokenizer.ggml.add_space_prefix", false);
  } else {
    g.str("general.architecture", pre == "qwen2" ? "qwen3" : "llama");
    g.str("tokenizer.ggml.model", "gpt2");
    g.str("tokenizer.ggml.pre", pre);
    g.str_array("tokenizer.ggml.tokens", tokens);
    g.i32_array("tokenizer.ggml.token_type", types);
    g.str_array("tokenizer.ggml.merges", merges);
  }
  if (ref.token_to_id("<unk>") >= 0)
    g.u32("tokenizer.ggml.unknown_token_id", uint32_t(ref.token_to_id("<unk>")));
  if (ref.bos_id() >= 0) g.u32("tokenizer.ggml.bos_token_id", uint32_t(ref.bos_id()));
  if (ref.eos_id() >= 0) g.u32("tokenizer.ggml.eos_token_id", uint32_t(ref.eos_id()));
  if (ref.pad_id() >= 0) g.u32("tokenizer.ggml.padding_token_id", uint32_t(ref.pad_id()));
  // As the reference adds BOS, so ids compare (Gemma 4's converter writes
  // true; GgufTokenizerGemma4.AddsBosByDefault checks the key's absence).
  g.boolean("tokenizer.ggml.add_bos_token", !ref.prefix_ids().empty());
  if (cfg.contains("chat_template") && cfg["chat_template"].is_string())
    g.str("tokenizer.chat_template", cfg["chat_template"].get<std::string>());
  g.write(path);
}

// Strings of the 2,100-string corpus (plus `extra`) whose ids (with and
// without special tokens) or decodes differ between ref and tok; the first
// five are reported.
int corpus_mismatches(const text::Tokenizer& ref, const text::Tokenizer& tok,
                      const std::string& name, const std::vector<std::string>& extra) {
  json corpus;
  std::ifstream(test::source_dir() + "/tests/fixtures/tokenizer/corpus.json") >> corpus;
  std::vector<std::string> texts = corpus["texts"].get<std::vector<std::string>>();
  texts.insert(texts.end(), extra.begin(), extra.end());
  int mismatches = 0;
  for (const std::string& t : texts) {
    const auto want = ref.encode(t, true), got = tok.encode(t, true);
    if (want != got && ++mismatches <= 5) ADD_FAILURE() << name << ": ids differ for " << json(t);
    if (ref.encode(t, false) != tok.encode(t, false) && ++mismatches <= 5)
      ADD_FAILURE() << name << ": plain ids differ for " << json(t);
    if (ref.decode(want, true) != tok.decode(want, true) && ++mismatches <= 5)
      ADD_FAILURE() << name << ": decode differs for " << json(t);
  }
  return mismatches;
}

class GgufTokenizer : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

// Same ids (with and without special tokens) and the same decodes as
// tokenizer.json on the 2,100-string corpus and a few special-token strings:
// byte-level BPE (Llama 3.1: llama-bpe, Qwen3: qwen2) and SentencePiece
// (Gemma 3: merges rebuilt from the scores).
TEST_P(GgufTokenizer, MatchesTokenizerJson) {
  const auto& [name, pre] = GetParam();
  const std::string dir = tokenizer_cache(name);
  if (!fs::exists(dir + "/tokenizer.json"))
    GTEST_SKIP() << "no " << name << " tokenizer in " << dir << "; run scripts/fetch_tokenizers.sh";
  test::TempDir tmp;
  const std::string path = tmp.path() + "/tok.gguf";
  write_tokenizer_gguf(dir, pre, path);
  const text::Tokenizer ref = text::Tokenizer::load(dir);
  const text::Tokenizer tok = gguf_tokenizer(*GgufFile::open(path));
  const int mismatches = corpus_mismatches(
      ref, tok, name,
      {"<|im_start|>user\nhi<|im_end|> <|begin_of_text|>x<|eot_id|><think>y</think>"});
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(tok.bos_id(), ref.bos_id());
  EXPECT_EQ(tok.eos_id(), ref.eos_id());
  EXPECT_EQ(tok.vocab_size(), ref.vocab_size());
}

INSTANTIATE_TEST_SUITE_P(Real, GgufTokenizer,
                         ::testing::Values(std::pair{std::string("llama3_1"),
                                                     std::string("llama-bpe")},
                                           std::pair{std::string("qwen3"), std::string("qwen2")},
                                           std::pair{std::string("gemma3"), std::string("spm")}),
                         [](const auto& info) { return info.param.first; });

// Gemma 4 (tokenizer.ggml.model "gemma4"), from the gemma4-demo checkpoint's
// tokenizer.json (laid out as Gemma 4's): the corpus (leading and repeated
// spaces, newlines, accents, CJK, emoji through byte fallback) plus chat
// tokens, and decode(encode(text)) giving the text back (a "▁" in it as " ").
TEST(GgufTokenizerGemma4, MatchesTokenizerJson) {
  const std::string dir = test::source_dir() + "/models/gemma4-demo";
  test::TempDir tmp;
  const std::string path = tmp.path() + "/tok.gguf";
  write_tokenizer_gguf(dir, "gemma4", path);
  const text::Tokenizer ref = text::Tokenizer::load(dir);
  const text::Tokenizer tok = gguf_tokenizer(*GgufFile::open(path));
  const std::vector<std::string> extra = {
      "<|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\nx<channel|>y",
      "<|tool_call>call:f{a:<|\"|>b<|\"|>}<tool_call|><|tool_response>r<tool_response|>",
      "  two leading spaces\n\n\nthree newlines\t tab",
      "日本語 中文 한국어 🫩🙂👍🏽 ǅ \xe2\x80\x8b zero-width"};
  EXPECT_EQ(corpus_mismatches(ref, tok, "gemma4", extra), 0);
  json corpus;
  std::ifstream(test::source_dir() + "/tests/fixtures/tokenizer/corpus.json") >> corpus;
  int bad = 0;
  for (const std::string& t : corpus["texts"].get<std::vector<std::string>>()) {
    std::string want = t;  // a "▁" in the text decodes as " ", as with tokenizer.json
    for (size_t p = 0; (p = want.find("\u2581", p)) != std::string::npos;) want.replace(p, 3, " ");
    if (tok.decode(tok.encode(t, false), false) != want && ++bad <= 5)
      ADD_FAILURE() << "gemma4: decode(encode(t)) != t for " << json(t);
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(tok.bos_id(), ref.bos_id());
  EXPECT_EQ(tok.eos_id(), ref.eos_id());
  EXPECT_EQ(tok.vocab_size(), ref.vocab_size());
}

// A small "gemma4" vocabulary: BOS added when tokenizer.ggml.add_bos_token is
// absent (llama.cpp adds it for Gemma 4), merges split at the first space,
// <0xNN> pieces for what the vocab lacks; no merges is an error.
TEST(GgufTokenizerGemma4, AddsBosByDefault) {
  test::TempDir tmp;
  const std::string path = tmp.path() + "/t.gguf";
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>",   "<unk>",   "\u2581",
                                     "a",     "b",     "\u2581a", "\u2581ab"};
  std::vector<int32_t> types = {3, 3, 3, 3, 1, 1, 1, 1, 1};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
  }
  test::GgufWriter g;
  g.str("tokenizer.ggml.model", "gemma4");
  g.str_array("tokenizer.ggml.tokens", tokens);
  g.i32_array("tokenizer.ggml.token_type", types);
  g.str_array("tokenizer.ggml.merges", {"\u2581 a", "\u2581a b"});
  g.u32("tokenizer.ggml.bos_token_id", 2);
  g.u32("tokenizer.ggml.eos_token_id", 1);
  g.write(path);
  const text::Tokenizer tok = gguf_tokenizer(*GgufFile::open(path));
  EXPECT_EQ(tok.encode(" ab c", true), (std::vector<int32_t>{2, 8, 4, 9 + 'c'}));
  EXPECT_EQ(tok.decode(tok.encode(" ab c", true), true), " ab c");
  test::GgufWriter n;
  n.str("tokenizer.ggml.model", "gemma4");
  n.str_array("tokenizer.ggml.tokens", tokens);
  n.write(path);
  std::string e;
  try {
    gguf_tokenizer(*GgufFile::open(path));
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("needs tokenizer.ggml.merges"), std::string::npos) << e;
}

TEST(GgufTokenizerErrors, UnsupportedModelsSaySo) {
  test::TempDir tmp;
  const std::string path = tmp.path() + "/t.gguf";
  test::GgufWriter g;
  g.str("tokenizer.ggml.model", "bert");
  g.write(path);
  std::string e;
  try {
    gguf_tokenizer(*GgufFile::open(path));
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("GGUF tokenizer model \"bert\" is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("put the model's tokenizer.json"), std::string::npos) << e;
  test::GgufWriter p;
  p.str("tokenizer.ggml.model", "gpt2");
  p.str("tokenizer.ggml.pre", "deepseek-llm");
  p.str_array("tokenizer.ggml.tokens", {"a"});
  p.write(path);
  e.clear();
  try {
    gguf_tokenizer(*GgufFile::open(path));
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("tokenizer.ggml.pre \"deepseek-llm\" is not supported"), std::string::npos) << e;
}

// The model's text (tokenizer + chat template) from a .gguf, through the
// server's ModelText, and a tokenizer.json beside the .gguf winning.
TEST(GgufModelText, TemplateAndTokenizerFromMetadata) {
  const std::string dir = tokenizer_cache("qwen3");
  if (!fs::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no qwen3 tokenizer in " << dir;
  test::TempDir tmp;
  const std::string path = tmp.path() + "/qwen.gguf";
  write_tokenizer_gguf(dir, "qwen2", path);
  auto from_gguf = server::ModelText::load(path);
  ASSERT_TRUE(from_gguf);
  ASSERT_TRUE(from_gguf->has_chat_template());
  auto from_json = server::ModelText::load(dir);
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Hello!"}}};
  EXPECT_EQ(from_gguf->chat_prompt(messages, nullptr, nullptr),
            from_json->chat_prompt(messages, nullptr, nullptr));
  EXPECT_TRUE(from_gguf->chat_format() == from_json->chat_format());
}

// A tokenizer.json beside the .gguf is used instead of the metadata.
TEST(GgufModelText, TokenizerJsonBesideWins) {
  const std::string dir = tokenizer_cache("qwen3");
  if (!fs::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no qwen3 tokenizer in " << dir;
  test::TempDir tmp;
  fs::copy_file(dir + "/tokenizer.json", tmp.path() + "/tokenizer.json");
  fs::copy_file(dir + "/tokenizer_config.json", tmp.path() + "/tokenizer_config.json");
  test::GgufWriter g;  // metadata whose tokenizer could not load
  g.str("general.architecture", "qwen3");
  g.str("tokenizer.ggml.model", "bert");
  g.write(tmp.path() + "/m.gguf");
  auto text = server::ModelText::load(tmp.path() + "/m.gguf");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->tokenizer().source(), tmp.path() + "/tokenizer.json");
  EXPECT_TRUE(text->has_chat_template());  // tokenizer_config.json's
}

// ---- The CLI on a .gguf path --------------------------------------------------------

TEST(GgufCli, LogitsRunAndMmproj) {
  const std::string fixture = test::fixture_dir("qwen3-f32");
  auto st = load_model(fixture);
  test::TempDir tmp;
  const std::string dir = tmp.path() + "/m";
  fs::create_directories(dir);
  const std::string path = dir + "/qwen3.gguf";
  test::write_model_gguf(*st, path, GgmlType::F32, GgmlType::F32);
  const auto a = test::run_tandem("logits " + fixture + " --ids 1,2,3");
  const auto b = test::run_tandem("logits " + path + " --ids 1,2,3");
  const auto c = test::run_tandem("logits " + dir + " --ids 1,2,3");  // the folder's one .gguf
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(b.out, c.out);
  const auto r = test::run_tandem("run " + path + " --ids 1,2,3 -n 4 --json");
  const auto rs = test::run_tandem("run " + fixture + " --ids 1,2,3 -n 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["ids"], json::parse(rs.out)["ids"]);
  const auto bench =
      test::run_tandem("bench " + path + " --prompt-tokens 4 --tokens 2 --peak-gbs 10 --threads 1");
  EXPECT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_NE(bench.err.find("(GGUF)"), std::string::npos) << bench.err;
  // --mmproj is checked before anything loads (tests/test_gguf_mmproj.cpp
  // runs real mmproj files).
  for (const char* cmd : {"run", "logits", "bench", "serve"}) {
    const std::string ids = cmd[0] == 'r' || cmd[0] == 'l' ? " --ids 1" : "";  // run, logits
    const auto m =
        test::run_tandem(std::string(cmd) + " " + path + ids + " --mmproj " + dir + "/none.gguf");
    EXPECT_EQ(m.exit_code, 1) << cmd;
    EXPECT_NE(m.err.find("--mmproj " + dir + "/none.gguf: no such file"), std::string::npos)
        << cmd << ": " << m.err;
  }
}

}  // namespace
