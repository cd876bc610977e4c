// config.json -> ModelSpec, for every supported family and both schemas.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/model.h"

namespace tandem {

using json = nlohmann::json;

namespace {

// Typed accessors that name the file and the field on a type error.
struct ConfigReader {
  const json& j;
  const std::string& source;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail("%s: missing required field \"%s\"", source.c_str(), key);
    const json& v = j.at(key);
    if (!v.is_number_integer())
      fail("%s: field \"%s\" must be an integer, found %s", source.c_str(), key, v.dump().c_str());
    int64_t x = v.get<int64_t>();
    if (x < 0)
      fail("%s: field \"%s\" must not be negative, found %lld", source.c_str(), key, (long long)x);
    return x;
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }

  double number(const json& obj, const char* key, double fallback) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    if (!obj.at(key).is_number())
      fail("%s: field \"%s\" must be a number, found %s", source.c_str(), key,
           obj.at(key).dump().c_str());
    return obj.at(key).get<double>();
  }
  double number_or(const char* key, double fallback) const { return number(j, key, fallback); }

  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_boolean())
      fail("%s: field \"%s\" must be true or false, found %s", source.c_str(), key,
           j.at(key).dump().c_str());
    return j.at(key).get<bool>();
  }

  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_string())
      fail("%s: field \"%s\" must be a string, found %s", source.c_str(), key,
           j.at(key).dump().c_str());
    return j.at(key).get<std::string>();
  }
};

RopeType parse_rope_type(const std::string& name, const std::string& source) {
  if (name == "default") return RopeType::Default;
  if (name == "linear") return RopeType::Linear;
  if (name == "llama3") return RopeType::Llama3;
  if (name == "yarn") return RopeType::Yarn;
  if (name == "proportional") return RopeType::Proportional;
  fail("%s: unsupported rope type \"%s\" (supported: default, linear, llama3, yarn, proportional)",
       source.c_str(), name.c_str());
}

// One RoPE parameter object: {"rope_type"|"type", "rope_theta", "factor", ...}.
// `theta` is the fallback base when the object does not carry rope_theta (old schema).
RopeSpec parse_rope_object(const ConfigReader& r, const json& obj, double theta) {
  if (!obj.is_object())
    fail("%s: rope parameters must be an object, found %s", r.source.c_str(), obj.dump().c_str());
  RopeSpec s;
  std::string type = "default";
  if (obj.contains("rope_type") && obj["rope_type"].is_string())
    type = obj["rope_type"];
  else if (obj.contains("type") && obj["type"].is_string())
    type = obj["type"];
  s.type = parse_rope_type(type, r.source);
  s.theta = r.number(obj, "rope_theta", theta);
  s.factor = r.number(obj, "factor", 1.0);
  s.low_freq_factor = r.number(obj, "low_freq_factor", 1.0);
  s.high_freq_factor = r.number(obj, "high_freq_factor", 4.0);
  s.original_max_position = int64_t(r.number(obj, "original_max_position_embeddings", 0));
  s.beta_fast = r.number(obj, "beta_fast", 32.0);
  s.beta_slow = r.number(obj, "beta_slow", 1.0);
  s.attention_factor = r.number(obj, "attention_factor", 0.0);
  s.partial_rotary_factor = r.number(obj, "partial_rotary_factor", 1.0);
  if (obj.contains("truncate") && obj["truncate"].is_boolean()) s.truncate = obj["truncate"];
  if (obj.contains("mscale") || obj.contains("mscale_all_dim")) {
    double m = r.number(obj, "mscale", 0.0), m_all = r.number(obj, "mscale_all_dim", 0.0);
    if (s.attention_factor == 0.0 && m != 0.0 && m_all != 0.0) {
      auto get_mscale = [&](double scale, double ms) {
        return scale <= 1.0 ? 1.0 : 0.1 * ms * std::log(scale) + 1.0;
      };
      s.attention_factor = get_mscale(s.factor, m) / get_mscale(s.factor, m_all);
    }
  }
  if ((s.type == RopeType::Llama3 || s.type == RopeType::Yarn) && s.original_max_position <= 0)
    fail("%s: rope type \"%s\" needs original_max_position_embeddings", r.source.c_str(),
         type.c_str());
  if (s.theta <= 0) fail("%s: rope_theta must be positive, found %g", r.source.c_str(), s.theta);
  return s;
}

void parse_rope(const ConfigReader& r, bool gemma, ModelSpec* spec) {
  const json& j = r.j;
  double default_theta = gemma ? 1000000.0 : 10000.0;
  if (r.has("rope_parameters")) {
    // New schema: either one object for every layer, or one per layer type.
    const json& rp = j["rope_parameters"];
    if (rp.contains("full_attention") || rp.contains("sliding_attention")) {
      const json& full =
          rp.contains("full_attention") ? rp["full_attention"] : rp["sliding_attention"];
      const json& slide = rp.contains("sliding_attention") ? rp["sliding_attention"] : full;
      spec->rope_full = parse_rope_object(r, full, default_theta);
      spec->rope_sliding = parse_rope_object(r, slide, 10000.0);
    } else {
      spec->rope_full = parse_rope_object(r, rp, r.number_or("rope_theta", default_theta));
      spec->rope_sliding = spec->rope_full;
    }
  } else {
    // Old schema: rope_theta + rope_scaling; Gemma 3's local layers use
    // rope_local_base_freq with no scaling.
    double theta = r.number_or("rope_theta", default_theta);
    json scaling = r.has("rope_scaling") ? j["rope_scaling"] : json::object();
    spec->rope_full = parse_rope_object(r, scaling, theta);
    spec->rope_sliding = spec->rope_full;
    if (gemma) {
      spec->rope_sliding = RopeSpec{};
      spec->rope_sliding.theta = r.number_or("rope_local_base_freq", 10000.0);
    }
  }
  double partial = r.number_or("partial_rotary_factor", 0.0);
  if (partial > 0.0)
    spec->rope_full.partial_rotary_factor = spec->rope_sliding.partial_rotary_factor = partial;
}

void parse_layers(const ConfigReader& r, ModelSpec* spec) {
  const json& j = r.j;
  std::vector<AttentionKind> kinds(size_t(spec->layers), AttentionKind::Full);
  if (r.has("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || int64_t(lt.size()) != spec->layers)
      fail("%s: layer_types must list %lld entries (num_hidden_layers), found %s", r.source.c_str(),
           (long long)spec->layers, lt.dump().c_str());
    for (int64_t i = 0; i < spec->layers; ++i) {
      std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t == "sliding_attention")
        kinds[i] = AttentionKind::Sliding;
      else if (t != "full_attention")
        fail("%s: layer_types[%lld] = %s is not \"full_attention\" or \"sliding_attention\"",
             r.source.c_str(), (long long)i, lt[i].dump().c_str());
    }
  } else if (r.has("sliding_window_pattern") || r.has("_sliding_window_pattern")) {
    // Old Gemma 3 schema: every pattern-th layer is global.
    int64_t pattern =
        r.integer_or("sliding_window_pattern", r.integer_or("_sliding_window_pattern", 6));
    if (pattern <= 0) fail("%s: sliding_window_pattern must be positive", r.source.c_str());
    for (int64_t i = 0; i < spec->layers; ++i)
      if ((i + 1) % pattern != 0) kinds[i] = AttentionKind::Sliding;
  } else if (spec->arch == "qwen2" && r.boolean_or("use_sliding_window", false)) {
    int64_t max_window_layers = r.integer_or("max_window_layers", spec->layers);
    for (int64_t i = max_window_layers; i < spec->layers; ++i) kinds[i] = AttentionKind::Sliding;
  }

  spec->layer.resize(size_t(spec->layers));
  for (int64_t i = 0; i < spec->layers; ++i) {
    LayerSpec& l = spec->layer[size_t(i)];
    l.kind = kinds[size_t(i)];
    l.head_dim = spec->head_dim;
    l.kv_heads = spec->kv_heads;
    l.intermediate = spec->intermediate;
    l.kv_source = i;
  }

  if (spec->arch == "gemma4_text") {
    // Full layers may have their own head dim / kv heads: per_layer_config
    // {"<layer>": {"head_dim": .., "num_key_value_heads": ..}} (transformers 5
    // re-saves), or global_head_dim / num_global_key_value_heads.
    const bool k_eq_v = r.boolean_or("attention_k_eq_v", false);
    if (r.has("per_layer_config")) {
      const json& plc = j["per_layer_config"];
      if (!plc.is_object()) fail("%s: per_layer_config must be an object", r.source.c_str());
      for (auto it = plc.begin(); it != plc.end(); ++it) {
        char* end = nullptr;
        long idx = std::strtol(it.key().c_str(), &end, 10);
        if (*end != '\0' || idx < 0 || idx >= spec->layers)
          fail("%s: per_layer_config key \"%s\" is not a layer index", r.source.c_str(),
               it.key().c_str());
        ConfigReader o{it.value(), r.source};
        LayerSpec& l = spec->layer[size_t(idx)];
        l.head_dim = o.integer_or("head_dim", l.head_dim);
        l.kv_heads = o.integer_or("num_key_value_heads", l.kv_heads);
      }
    } else {
      const int64_t global_dim = r.integer_or("global_head_dim", spec->head_dim);
      const int64_t global_kv = r.integer_or("num_global_key_value_heads", 0);
      for (auto& l : spec->layer)
        if (l.kind == AttentionKind::Full) {
          l.head_dim = global_dim;
          if (k_eq_v && global_kv > 0) l.kv_heads = global_kv;
        }
    }
    for (auto& l : spec->layer) l.k_eq_v = k_eq_v && l.kind == AttentionKind::Full;
    if (r.boolean_or("enable_moe_block", false))
      fail("%s: Gemma 4 mixture-of-experts blocks (enable_moe_block) are not supported yet",
           r.source.c_str());
    // KV sharing: the last num_kv_shared_layers layers reuse the keys and
    // values of the last earlier layer of their kind that computes its own.
    const int64_t shared = r.integer_or("num_kv_shared_layers", 0);
    const int64_t first_shared = spec->layers - shared;
    if (shared > 0 && first_shared <= 0)
      fail("%s: num_kv_shared_layers (%lld) must be below num_hidden_layers (%lld)",
           r.source.c_str(), (long long)shared, (long long)spec->layers);
    const bool double_wide = r.boolean_or("use_double_wide_mlp", false);
    for (int64_t i = std::max<int64_t>(first_shared, 0); i < spec->layers && shared > 0; ++i) {
      LayerSpec& l = spec->layer[size_t(i)];
      int64_t src = -1;
      for (int64_t p = first_shared - 1; p >= 0; --p)
        if (spec->layer[size_t(p)].kind == l.kind) {
          src = p;
          break;
        }
      if (src < 0)
        fail("%s: KV-shared layer %lld has no earlier %s layer to share with", r.source.c_str(),
             (long long)i, l.kind == AttentionKind::Full ? "full-attention" : "sliding");
      l.kv_source = src;
      if (double_wide) l.intermediate *= 2;
    }
    for (auto& l : spec->layer) {
      const LayerSpec& src = spec->layer[size_t(l.kv_source)];
      if (l.head_dim != src.head_dim || l.kv_heads != src.kv_heads)
        fail("%s: a KV-shared layer's head shape differs from its source layer's",
             r.source.c_str());
    }
  }
  for (const auto& l : spec->layer)
    if (l.head_dim <= 0 || l.head_dim % 2 != 0 || l.kv_heads <= 0 || spec->heads % l.kv_heads != 0)
      fail("%s: every layer needs an even head_dim and kv heads dividing num_attention_heads",
           r.source.c_str());

  if (spec->has_kind(AttentionKind::Sliding)) {
    spec->sliding_window = r.integer_or("sliding_window", 0);
    if (spec->sliding_window <= 0)
      fail("%s: sliding layers need a positive sliding_window", r.source.c_str());
  }
}

bool j_has(const json& obj, const char* key) {
  return obj.is_object() && obj.contains(key) && !obj[key].is_null();
}

std::vector<int32_t> parse_ids(const json& v) {
  std::vector<int32_t> ids;
  if (v.is_number_integer())
    ids.push_back(v.get<int32_t>());
  else if (v.is_array())
    for (const auto& e : v)
      if (e.is_number_integer()) ids.push_back(e.get<int32_t>());
  return ids;
}

}  // namespace

ModelSpec parse_model_spec(const std::string& text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail("%s: not valid JSON: %s", source.c_str(), e.what());
  }
  if (!root.is_object()) fail("%s: expected a JSON object", source.c_str());
  // Multimodal configs keep the language model in text_config; the outer
  // tie_word_embeddings applies when the inner one is absent.
  const json* cfg = &root;
  if (root.contains("text_config") && root["text_config"].is_object()) cfg = &root["text_config"];
  ConfigReader r{*cfg, source};
  ConfigReader outer{root, source};

  ModelSpec s;
  s.arch = r.string_or("model_type", outer.string_or("model_type", ""));
  if (s.arch == "gemma3") s.arch = "gemma3_text";
  if (s.arch == "gemma4") s.arch = "gemma4_text";
  if (s.arch == "mistral3") s.arch = "ministral3";
  static const char* kSupported[] = {"llama",       "qwen2",       "qwen3",
                                     "gemma3_text", "gemma4_text", "ministral3"};
  bool known = false;
  for (const char* a : kSupported) known |= s.arch == a;
  if (!known)
    fail(
        "%s: model_type \"%s\" is not supported (supported: llama, qwen2, qwen3, gemma3_text, "
        "gemma3, "
        "gemma4_text, gemma4, ministral3, mistral3)",
        source.c_str(), s.arch.c_str());
  const bool gemma = s.arch == "gemma3_text";  // Gemma 1-3 conventions
  const bool gemma4 = s.arch == "gemma4_text";

  s.vocab = r.integer("vocab_size");
  s.hidden = r.integer("hidden_size");
  s.layers = r.integer("num_hidden_layers");
  s.heads = r.integer("num_attention_heads");
  s.kv_heads = r.integer_or("num_key_value_heads", s.heads);
  s.intermediate = r.integer("intermediate_size");
  if (s.heads == 0 || s.kv_heads == 0 || s.heads % s.kv_heads != 0)
    fail("%s: num_attention_heads (%lld) must be a positive multiple of num_key_value_heads (%lld)",
         source.c_str(), (long long)s.heads, (long long)s.kv_heads);
  s.head_dim = r.integer_or("head_dim", s.hidden / s.heads);
  if (s.head_dim == 0 || s.head_dim % 2 != 0)
    fail("%s: head_dim must be even and positive, found %lld", source.c_str(),
         (long long)s.head_dim);
  s.max_position = r.integer_or("max_position_embeddings", 4096);
  s.norm_eps = float(r.number_or("rms_norm_eps", 1e-6));
  // A multimodal wrapper's own tie_word_embeddings decides for the whole
  // model (transformers ties Mistral3's head even when its text_config says
  // false); otherwise the language model's.
  const bool family_ties = gemma || gemma4;
  if (cfg != &root && outer.has("tie_word_embeddings"))
    s.tied_embeddings = outer.boolean_or("tie_word_embeddings", true);
  else
    s.tied_embeddings = r.boolean_or("tie_word_embeddings", family_ties);

  std::string act =
      r.string_or("hidden_activation",
                  r.string_or("hidden_act", gemma || gemma4 ? "gelu_pytorch_tanh" : "silu"));
  if (act == "silu" || act == "swish")
    s.activation = Activation::SiLU;
  else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh")
    s.activation = Activation::GeluTanh;
  else
    fail("%s: activation \"%s\" is not supported (silu, gelu_pytorch_tanh)", source.c_str(),
         act.c_str());

  if (s.arch == "llama") {
    s.qkv_bias = s.o_bias = r.boolean_or("attention_bias", false);
    s.mlp_bias = r.boolean_or("mlp_bias", false);
  } else if (s.arch == "qwen2") {
    s.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o bias
  } else if (s.arch == "qwen3") {
    s.qkv_bias = s.o_bias = r.boolean_or("attention_bias", false);
    s.qk_norm = true;
  } else if (gemma || gemma4) {
    s.qkv_bias = s.o_bias = r.boolean_or("attention_bias", false);
    s.qk_norm = true;
    s.sandwich_norms = true;
    s.scale_embeddings = true;
    s.norm_style = gemma ? NormStyle::OnePlusWeight : NormStyle::Weight;
    if (gemma4) {
      s.v_norm = true;
      s.layer_scalars = true;
      s.ple_dim = r.integer_or("hidden_size_per_layer_input", 0);
      s.ple_vocab = s.ple_dim > 0 ? r.integer_or("vocab_size_per_layer_input", s.vocab) : 0;
      const std::string bidir = r.string_or("use_bidirectional_attention", "");
      if (bidir == "all")
        fail("%s: use_bidirectional_attention \"all\" (an encoder) is not supported",
             source.c_str());
    }
  }

  double scalar =
      gemma ? r.number_or("query_pre_attn_scalar", double(s.head_dim)) : double(s.head_dim);
  if (scalar <= 0) fail("%s: query_pre_attn_scalar must be positive", source.c_str());
  s.attn_scale =
      gemma4 ? 1.0f : float(1.0 / std::sqrt(scalar));  // Gemma 4: the q/k norms replace the scale
  // transformers' Gemma 3 attention never passes attn_logit_softcapping to
  // its attention function, so the field is ignored there; do the same.
  s.attn_softcap = gemma ? 0.0f : float(r.number_or("attn_logit_softcapping", 0.0));
  s.final_softcap = float(r.number_or("final_logit_softcapping", 0.0));

  parse_rope(r, gemma || gemma4, &s);
  parse_layers(r, &s);
  if (s.arch == "ministral3" && r.has("rope_parameters") &&
      j_has(r.j["rope_parameters"], "llama_4_scaling_beta")) {
    const json& rp = r.j["rope_parameters"];
    s.query_temperature_beta = float(r.number(rp, "llama_4_scaling_beta", 0.0));
    s.query_temperature_base = int64_t(r.number(rp, "original_max_position_embeddings", 0.0));
    if (s.query_temperature_beta != 0.0f && s.query_temperature_base <= 0)
      fail("%s: llama_4_scaling_beta needs original_max_position_embeddings in rope_parameters",
           source.c_str());
  }

  s.eos_ids = parse_ids(r.has("eos_token_id") ? (*cfg)["eos_token_id"]
                                              : root.value("eos_token_id", json()));
  json bos = r.has("bos_token_id") ? (*cfg)["bos_token_id"] : root.value("bos_token_id", json());
  s.bos_id = bos.is_number_integer() ? bos.get<int32_t>() : -1;
  json pad = r.has("pad_token_id") ? (*cfg)["pad_token_id"] : root.value("pad_token_id", json());
  s.pad_id = pad.is_number_integer() ? pad.get<int32_t>() : gemma4 ? 0 : -1;  // Gemma 4: default 0
  return s;
}

static std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read %s", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int64_t ModelSpec::max_head_dim() const {
  int64_t m = 0;
  for (const auto& l : layer) m = std::max(m, l.head_dim);
  return m;
}

int64_t ModelSpec::max_intermediate() const {
  int64_t m = 0;
  for (const auto& l : layer) m = std::max(m, l.intermediate);
  return m;
}

ModelSpec load_model_spec(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path config = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(config))
    fail("%s: no config.json (a model folder needs config.json and *.safetensors)", dir.c_str());
  ModelSpec spec = parse_model_spec(read_file(config.string()), config.string());
  // generation_config.json's eos ids are the ones generation stops on.
  fs::path gen = fs::path(dir) / "generation_config.json";
  if (fs::is_regular_file(gen)) {
    json g = json::parse(read_file(gen.string()), nullptr, /*allow_exceptions=*/false);
    if (g.is_object() && g.contains("eos_token_id")) {
      auto ids = parse_ids(g["eos_token_id"]);
      if (!ids.empty()) spec.eos_ids = ids;
    }
  }
  return spec;
}

}  // namespace tandem
