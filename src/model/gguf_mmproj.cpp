#include "model/gguf_mmproj.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_blocks.h"

namespace tandem {

namespace {

using nlohmann::json;

// What keeps a translated mmproj's tensors alive: the mapping, and the f32
// copies of block-typed and row-permuted tensors.
struct MmprojStorage {
  std::shared_ptr<GgufFile> file;
  std::vector<std::vector<float>> dequantized;
};

// Per-layer tensors: llama.cpp's name -> transformers' (under the tower's
// layer prefix). SigLIP (Gemma 3) has weights and biases, Pixtral weights.
using NamePairs = std::vector<std::pair<std::string, std::string>>;
const NamePairs kSiglipLayer = {
    {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"}, {"attn_out", "self_attn.out_proj"},
    {"ln1", "layer_norm1"},         {"ln2", "layer_norm2"},
    {"ffn_up", "mlp.fc1"},          {"ffn_down", "mlp.fc2"},
};
const NamePairs kPixtralLayer = {
    {"attn_q", "attention.q_proj"},
    {"attn_k", "attention.k_proj"},
    {"attn_v", "attention.v_proj"},
    {"attn_out", "attention.o_proj"},
    {"ln1", "attention_norm"},
    {"ln2", "ffn_norm"},
    {"ffn_gate", "feed_forward.gate_proj"},
    {"ffn_up", "feed_forward.up_proj"},
    {"ffn_down", "feed_forward.down_proj"},
};

// How one projector type's file maps onto a transformers checkpoint.
struct Layout {
  NamePairs fixed;                    // whole-model tensors, with their suffix
  NamePairs layer;                    // per-layer tensors, without suffix
  std::string layer_prefix;           // transformers prefix of layer N's tensors, before N
  std::vector<std::string> suffixes;  // of per-layer tensors: .weight (and .bias)
  std::vector<std::string> optional;  // fixed tensors that may be absent
};

Layout layout_of(const std::string& projector) {
  if (projector == "gemma3") {
    const std::string t = "vision_tower.vision_model.", m = "multi_modal_projector.";
    return {{{"v.patch_embd.weight", t + "embeddings.patch_embedding.weight"},
             {"v.patch_embd.bias", t + "embeddings.patch_embedding.bias"},
             {"v.position_embd.weight", t + "embeddings.position_embedding.weight"},
             {"v.post_ln.weight", t + "post_layernorm.weight"},
             {"v.post_ln.bias", t + "post_layernorm.bias"},
             {"mm.input_projection.weight", m + "mm_input_projection_weight"},
             {"mm.soft_emb_norm.weight", m + "mm_soft_emb_norm.weight"}},
            kSiglipLayer,
            t + "encoder.layers.",
            {".weight", ".bias"},
            {}};
  }
  const std::string t = "vision_tower.", m = "multi_modal_projector.";
  return {{{"v.patch_embd.weight", t + "patch_conv.weight"},
           {"v.pre_ln.weight", t + "ln_pre.weight"},
           {"mm.input_norm.weight", m + "norm.weight"},
           {"mm.patch_merger.weight", m + "patch_merger.merging_layer.weight"},
           {"mm.1.weight", m + "linear_1.weight"},
           {"mm.1.bias", m + "linear_1.bias"},
           {"mm.2.weight", m + "linear_2.weight"},
           {"mm.2.bias", m + "linear_2.bias"}},
          kPixtralLayer,
          t + "transformer.layers.",
          {".weight"},
          {"mm.1.bias", "mm.2.bias"}};
}

// The transformers name of an mmproj tensor, "" for one the tower does not
// use (llama.cpp's extras, e.g. v.token_embd.img_break).
std::string hf_name(const Layout& l, const std::string& n) {
  for (const auto& [gguf, hf] : l.fixed)
    if (n == gguf) return hf;
  if (n.rfind("v.blk.", 0) != 0) return "";
  const size_t dot = n.find('.', 6);
  if (dot == std::string::npos) return "";
  const std::string layer = n.substr(6, dot - 6), rest = n.substr(dot + 1);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return "";
  for (const auto& [gguf, hf] : l.layer)
    for (const std::string& kind : l.suffixes)
      if (rest == gguf + kind) return l.layer_prefix + layer + "." + hf + kind;
  return "";
}

// The GGUF tensors a tower of `layers` blocks needs.
std::vector<std::string> required(const Layout& l, int64_t layers) {
  std::vector<std::string> names;
  for (const auto& [gguf, hf] : l.fixed)
    if (std::find(l.optional.begin(), l.optional.end(), gguf) == l.optional.end())
      names.push_back(gguf);
  for (int64_t i = 0; i < layers; ++i)
    for (const auto& [gguf, hf] : l.layer)
      for (const std::string& kind : l.suffixes)
        names.push_back("v.blk." + std::to_string(i) + "." + gguf + kind);
  return names;
}

int64_t require_key(const GgufFile& f, const std::string& key, const std::string& projector) {
  if (!f.find(key))
    fail("%s: mmproj metadata key \"%s\" is missing (needed for projector type %s)",
         f.path().c_str(), key.c_str(), projector.c_str());
  return f.get_int(key, 0);
}

// clip.vision.image_mean / image_std (three numbers) into `out[name]`, when
// present (else the family's default applies).
void channel_triple(const GgufFile& f, const std::string& key, const char* name, json& out) {
  const GgufValue* v = f.find(key);
  if (!v) return;
  if (!v->is_array() || v->as_array().size() != 3)
    fail("%s: mmproj metadata key \"%s\" must be an array of 3 numbers", f.path().c_str(),
         key.c_str());
  json a = json::array();
  for (const GgufValue& x : v->as_array()) {
    if (!x.is_number())
      fail("%s: mmproj metadata key \"%s\" must be an array of 3 numbers", f.path().c_str(),
           key.c_str());
    a.push_back(float(x.as_number()));
  }
  out[name] = a;
}

// The vision_config fields every projector type has.
json vision_config(const GgufFile& f, const std::string& pt) {
  const std::string v = "clip.vision.";
  json vc;
  vc["hidden_size"] = require_key(f, v + "embedding_length", pt);
  vc["intermediate_size"] = require_key(f, v + "feed_forward_length", pt);
  vc["num_hidden_layers"] = require_key(f, v + "block_count", pt);
  vc["num_attention_heads"] = require_key(f, v + "attention.head_count", pt);
  vc["image_size"] = require_key(f, v + "image_size", pt);
  vc["patch_size"] = require_key(f, v + "patch_size", pt);
  if (vc["num_attention_heads"].get<int64_t>() <= 0 || vc["patch_size"].get<int64_t>() <= 0)
    fail("%s: clip.vision.attention.head_count and clip.vision.patch_size must be positive",
         f.path().c_str());
  return vc;
}

// The Gemma 3 config.json fields from clip.* metadata.
json gemma3_config(const GgufFile& f) {
  json vc = vision_config(f, "gemma3");
  vc["layer_norm_eps"] = float(f.get_number("clip.vision.attention.layer_norm_epsilon", 1e-6));
  const int64_t side = vc["image_size"].get<int64_t>() / vc["patch_size"].get<int64_t>();
  const int64_t k = f.get_int("clip.vision.projector.scale_factor", 4);
  if (k <= 0 || side % k != 0)
    fail("%s: clip.vision.projector.scale_factor %lld does not divide the %lld patches per side",
         f.path().c_str(), (long long)k, (long long)side);
  json c;
  c["model_type"] = "gemma3";
  c["vision_config"] = vc;
  c["mm_tokens_per_image"] = (side / k) * (side / k);
  c["tandem_soft_emb_norm_plus_one"] = true;
  return c;
}

// The Mistral 3 (Pixtral) config.json fields. RoPE theta: not written by
// llama.cpp's converter (clip.vision.rope.freq_base when present), 10000.
json pixtral_config(const GgufFile& f) {
  json vc = vision_config(f, "pixtral");
  vc["head_dim"] = vc["hidden_size"].get<int64_t>() / vc["num_attention_heads"].get<int64_t>();
  const GgufValue* silu = f.find("clip.use_silu");
  vc["hidden_act"] =
      silu && silu->type == GgufValue::Type::Bool && silu->as_int() ? "silu" : "gelu";
  vc["rope_theta"] = f.get_number("clip.vision.rope.freq_base", 10000.0);
  json c;
  c["model_type"] = "mistral3";
  c["vision_config"] = vc;
  c["spatial_merge_size"] = f.get_int("clip.vision.spatial_merge_size", 2);
  c["projector_hidden_act"] = "gelu";
  c["multimodal_projector_bias"] = f.tensor("mm.1.bias") != nullptr;
  return c;
}

// llama.cpp's converter permutes Pixtral's q/k rows per head for its
// interleaved RoPE (as for llama text models); row r of the transformers
// tensor is row src_row(r) of the file's.
int64_t src_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, i = r % head_dim, half = head_dim / 2;
  return h * head_dim + (i % half) * 2 + i / half;
}

}  // namespace

MmprojTower open_mmproj(const std::string& path) {
  auto storage = std::make_shared<MmprojStorage>();
  storage->file = GgufFile::open(path);
  const GgufFile& f = *storage->file;
  const char* p = path.c_str();
  if (const GgufValue* has = f.find("clip.has_vision_encoder")) {
    if (!has->is_integer() && has->type != GgufValue::Type::Bool)
      fail("%s: metadata key \"clip.has_vision_encoder\" must be a bool", p);
    if (has->as_int() == 0)
      fail("%s: clip.has_vision_encoder is false: this mmproj has no vision tower", p);
  }
  if (!f.find("clip.projector_type"))
    fail("%s: not a llama.cpp mmproj file: metadata key \"clip.projector_type\" is missing%s", p,
         f.find("general.architecture") ? " (is it a text model?)" : "");
  MmprojTower out;
  out.path = path;
  out.projector = f.get_string("clip.projector_type", "");
  if (out.projector != "gemma3" && out.projector != "pixtral")
    fail(
        "%s: clip.projector_type \"%s\" is not supported (tandem runs mmproj vision towers of "
        "projector types gemma3 and pixtral)",
        p, out.projector.c_str());
  const bool pixtral = out.projector == "pixtral";
  out.config = pixtral ? pixtral_config(f) : gemma3_config(f);
  out.projection_dim = f.get_int("clip.vision.projection_dim", 0);
  const Layout layout = layout_of(out.projector);
  const json& vc = out.config["vision_config"];
  for (const std::string& name : required(layout, vc["num_hidden_layers"].get<int64_t>()))
    if (!f.tensor(name))
      fail("%s: missing tensor \"%s\" (needed for projector type %s)", p, name.c_str(),
           out.projector.c_str());
  out.preprocessor = json::object();
  channel_triple(f, "clip.vision.image_mean", "image_mean", out.preprocessor);
  channel_triple(f, "clip.vision.image_std", "image_std", out.preprocessor);

  const int64_t head_dim = pixtral ? vc["head_dim"].get<int64_t>() : 0;
  std::vector<Checkpoint::MemoryTensor> tensors;
  for (const GgufTensor& t : f.tensors()) {
    std::string name = hf_name(layout, t.name);
    if (name.empty()) continue;
    out.tensor_bytes += t.bytes;
    Checkpoint::MemoryTensor m{std::move(name), DType::F32, {}, f.data(t)};
    for (auto it = t.dims.rbegin(); it != t.dims.rend(); ++it) m.shape.push_back(*it);
    const bool permuted = pixtral && (t.name.find(".attn_q.") != std::string::npos ||
                                      t.name.find(".attn_k.") != std::string::npos);
    // F32/F16/BF16 are viewed in the mapping; block types and permuted
    // rows become f32 copies (exact).
    if (t.type == GgmlType::F16) m.dtype = DType::F16;
    if (t.type == GgmlType::BF16) m.dtype = DType::BF16;
    const bool dense =
        t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16;
    if (permuted || !dense) {
      const int64_t rows = t.rows(), cols = t.cols();
      std::vector<float> v(size_t(rows * cols));
      gguf_dequantize(t.type, f.data(t), rows * cols, v.data());
      if (permuted) {
        if (head_dim <= 0 || head_dim % 2 != 0 || rows % head_dim != 0)
          fail("%s: tensor \"%s\": %lld rows are not whole heads of %lld", p, t.name.c_str(),
               (long long)rows, (long long)head_dim);
        std::vector<float> hf(v.size());
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(v.begin() + src_row(r, head_dim) * cols, cols, hf.begin() + r * cols);
        v = std::move(hf);
      }
      m.dtype = DType::F32;
      m.data = storage->dequantized.emplace_back(std::move(v)).data();
    }
    tensors.push_back(std::move(m));
  }
  out.checkpoint = Checkpoint::from_memory(path, std::move(tensors), storage);
  return out;
}

}  // namespace tandem
