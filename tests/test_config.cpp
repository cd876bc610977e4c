// config.json parsing: both schemas give the same spec; errors name the field.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/model.h"
#include "model/rope.h"
#include "test_util.h"

using namespace tandem;
using nlohmann::json;

namespace {

json fixture_config(const std::string& name) {
  std::ifstream f(test::fixture_dir(name) + "/config.json");
  return json::parse(f);
}

ModelSpec parse(const json& j) {
  return parse_model_spec(j.dump(), "config.json");
}

void expect_same_rope(const RopeSpec& a, const RopeSpec& b, int64_t head_dim) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(make_rope_table(a, head_dim).inv_freq, make_rope_table(b, head_dim).inv_freq);
}

std::string error_of(const json& j) {
  try {
    parse(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, LlamaOldSchemaEqualsNew) {
  json fresh = fixture_config("llama-f32");
  json old = fresh;
  old.erase("rope_parameters");
  old["rope_theta"] = 500000.0;
  old["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 16}};
  ModelSpec a = parse(fresh), b = parse(old);
  EXPECT_EQ(a.rope_full.type, RopeType::Llama3);
  expect_same_rope(a.rope_full, b.rope_full, a.head_dim);
  EXPECT_FALSE(a.tied_embeddings);
  EXPECT_FLOAT_EQ(a.attn_scale, 0.25f);  // head_dim 16
}

TEST(Config, Gemma3OldSchemaEqualsNew) {
  json fresh = fixture_config("gemma3-f32");
  json old = fresh;
  json& t = old["text_config"];
  t.erase("rope_parameters");
  t.erase("layer_types");
  t["rope_theta"] = 1000000.0;
  t["rope_local_base_freq"] = 10000.0;
  t["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  t["sliding_window_pattern"] = 3;  // layers 0,1 slide, 2 is global, 3 slides
  ModelSpec a = parse(fresh), b = parse(old);
  EXPECT_EQ(a.arch, "gemma3_text");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.layer[i].kind, b.layer[i].kind) << i;
  EXPECT_EQ(a.layer[2].kind, AttentionKind::Full);
  EXPECT_EQ(a.layer[3].kind, AttentionKind::Sliding);
  EXPECT_EQ(a.rope_full.type, RopeType::Linear);
  expect_same_rope(a.rope_full, b.rope_full, a.head_dim);
  expect_same_rope(a.rope_sliding, b.rope_sliding, a.head_dim);
  EXPECT_EQ(b.rope_sliding.theta, 10000.0);
  EXPECT_EQ(a.norm_style, NormStyle::OnePlusWeight);
  EXPECT_TRUE(a.tied_embeddings);
  EXPECT_FLOAT_EQ(a.attn_scale, 1.0f / std::sqrt(24.0f));  // query_pre_attn_scalar
  EXPECT_EQ(a.sliding_window, 8);
}

TEST(Config, Gemma3DefaultPatternIsEverySixthLayerGlobal) {
  json j = fixture_config("gemma3_text-f32");
  j.erase("layer_types");
  j.erase("_sliding_window_pattern");
  j["num_hidden_layers"] = 12;
  j["sliding_window_pattern"] = 6;
  ModelSpec s = parse(j);
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(s.layer[i].kind, (i + 1) % 6 == 0 ? AttentionKind::Full : AttentionKind::Sliding)
        << i;
}

TEST(Config, FamilyFlags) {
  ModelSpec qwen2 = parse(fixture_config("qwen2-f32"));
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.o_bias);
  EXPECT_FALSE(qwen2.qk_norm);
  ModelSpec qwen3 = parse(fixture_config("qwen3-f32"));
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim, 32);  // explicit, not hidden / heads
  ModelSpec gemma = parse(fixture_config("gemma3_text-f32"));
  EXPECT_TRUE(gemma.sandwich_norms && gemma.scale_embeddings);
  EXPECT_EQ(gemma.activation, Activation::GeluTanh);
  EXPECT_FLOAT_EQ(gemma.final_softcap, 3.0f);
  EXPECT_EQ(gemma.attn_softcap, 0.0f);  // ignored by transformers' Gemma 3 too
  EXPECT_EQ(gemma.eos_ids, std::vector<int32_t>{1});
}

TEST(Config, Gemma4LayersShareKvAndWidenTheirMlp) {
  ModelSpec s = parse(fixture_config("gemma4-f32"));  // the multimodal wrapper
  EXPECT_EQ(s.arch, "gemma4_text");
  EXPECT_EQ(s.norm_style, NormStyle::Weight);
  EXPECT_EQ(s.attn_scale, 1.0f);
  EXPECT_TRUE(s.v_norm && s.layer_scalars && s.tied_embeddings);
  EXPECT_EQ(s.ple_dim, 16);
  EXPECT_EQ(s.rope_full.type, RopeType::Proportional);
  // Layers: s s f s s f; the last two share KV with layers 3 (sliding) and 2 (full).
  const int64_t source[] = {0, 1, 2, 3, 3, 2}, head_dim[] = {32, 32, 64, 32, 32, 64},
                inter[] = {96, 96, 96, 96, 192, 192};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(s.layer[i].kv_source, source[i]) << i;
    EXPECT_EQ(s.layer[i].head_dim, head_dim[i]) << i;
    EXPECT_EQ(s.layer[i].intermediate, inter[i]) << i;
  }
  // The older spelling: global_head_dim instead of per_layer_config.
  json j = fixture_config("gemma4_text-f32");
  j.erase("per_layer_config");
  j["global_head_dim"] = 64;
  ModelSpec old = parse(j);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(old.layer[i].head_dim, head_dim[i]) << i;
}

TEST(Config, Ministral3HasYarnAndQueryTemperatureAndTheWrapperTiesTheHead) {
  ModelSpec s = parse(fixture_config("mistral3-f32"));
  EXPECT_EQ(s.arch, "ministral3");
  EXPECT_EQ(s.rope_full.type, RopeType::Yarn);
  EXPECT_FLOAT_EQ(s.query_temperature_beta, 0.1f);
  EXPECT_EQ(s.query_temperature_base, 16);
  EXPECT_TRUE(s.tied_embeddings);  // text_config says false; Mistral3Config's true wins
  EXPECT_FALSE(parse(fixture_config("ministral3-f32")).tied_embeddings);
}

TEST(Config, RealConfigsOfBenchmarkModels) {
  for (const char* name : {"llama-3.2-1b", "gemma-3-1b", "qwen3-1.7b"}) {
    std::ifstream f(test::source_dir() + "/bench/configs/" + name + ".json");
    std::stringstream text;
    text << f.rdbuf();
    ModelSpec s = parse_model_spec(text.str(), name);
    EXPECT_GT(s.layers, 0) << name;
  }
}

TEST(Config, ErrorsNameTheField) {
  json j = fixture_config("llama-f32");
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("\"hidden_size\""), std::string::npos) << error_of(j);

  j = fixture_config("llama-f32");
  j["num_hidden_layers"] = "three";
  EXPECT_NE(error_of(j).find("must be an integer"), std::string::npos) << error_of(j);

  j = fixture_config("llama-f32");
  j["model_type"] = "mamba";
  EXPECT_NE(error_of(j).find("\"mamba\" is not supported"), std::string::npos) << error_of(j);

  j = fixture_config("llama-f32");
  j["rope_parameters"]["rope_type"] = "longrope";
  EXPECT_NE(error_of(j).find("unsupported rope type \"longrope\""), std::string::npos)
      << error_of(j);

  j = fixture_config("llama-f32");
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("multiple of num_key_value_heads"), std::string::npos) << error_of(j);

  j = fixture_config("gemma3_text-f32");
  j["layer_types"] = {"full_attention"};
  EXPECT_NE(error_of(j).find("layer_types must list 4 entries"), std::string::npos) << error_of(j);

  EXPECT_THROW(parse_model_spec("{not json", "x/config.json"), Error);
}

TEST(Rope, Llama3KeepsShortWavelengthsAndScalesLongOnes) {
  RopeSpec s;
  s.type = RopeType::Llama3;
  s.theta = 500000.0;
  s.factor = 32.0;
  s.original_max_position = 8192;
  RopeTable t = make_rope_table(s, 64);
  RopeSpec plain = s;
  plain.type = RopeType::Default;
  RopeTable base = make_rope_table(plain, 64);
  EXPECT_EQ(t.inv_freq[0], base.inv_freq[0]);                  // wavelength 2π < 2048: kept
  EXPECT_FLOAT_EQ(t.inv_freq[31], base.inv_freq[31] / 32.0f);  // longest: divided by the factor
  for (size_t i = 0; i < t.inv_freq.size(); ++i) {
    EXPECT_LE(t.inv_freq[i], base.inv_freq[i]);
    EXPECT_GE(t.inv_freq[i], base.inv_freq[i] / 32.0f * 0.999f);
  }
}

TEST(Rope, YarnMatchesTheClosedForm) {
  // YaRN with Ministral 3's parameters: dims below the correction range keep
  // their frequency, dims above it are divided by the factor.
  RopeSpec s;
  s.type = RopeType::Yarn;
  s.theta = 1e6;
  s.factor = 16.0;
  s.original_max_position = 16384;
  s.beta_fast = 32;
  s.beta_slow = 1;
  RopeTable t = make_rope_table(s, 128);
  RopeSpec plain = s;
  plain.type = RopeType::Default;
  RopeTable base = make_rope_table(plain, 128);
  EXPECT_FLOAT_EQ(t.inv_freq[0], base.inv_freq[0]);
  EXPECT_FLOAT_EQ(t.inv_freq[63], base.inv_freq[63] / 16.0f);
  EXPECT_NEAR(t.attention_scaling, 0.1 * std::log(16.0) + 1.0, 1e-6);
}

TEST(Rope, RotationIsNormPreservingAndIdentityAtZero) {
  RopeTable t = make_rope_table(RopeSpec{}, 8);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  std::copy(x, x + 8, y);
  apply_rope(t, 0, y, 1, 8);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(y[i], x[i]);
  apply_rope(t, 37, y, 1, 8);
  float n0 = 0, n1 = 0;
  for (int i = 0; i < 8; ++i) n0 += x[i] * x[i], n1 += y[i] * y[i];
  EXPECT_NEAR(n0, n1, 1e-3);
  // Pairing is rotate-half: dim 0 mixes with dim 4, never with dim 1.
  float e[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  apply_rope(t, 1, e, 1, 8);
  EXPECT_FLOAT_EQ(e[1], 0.0f);
  EXPECT_NEAR(e[4], std::sin(1.0f), 1e-6);
}

}  // namespace
