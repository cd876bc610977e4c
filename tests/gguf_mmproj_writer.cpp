// write_mmproj_gguf (gguf_writer.h): a Gemma 3 or Mistral 3 checkpoint's
// vision tower as llama.cpp's converter writes an mmproj file.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf_writer.h"
#include "model/safetensors.h"

namespace tandem::test {

void write_mmproj_gguf(const std::string& dir, const std::string& path, GgmlType type,
                       const std::string& skip, const std::string& projector) {
  std::ifstream cf(dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(cf), &vc = config["vision_config"];
  const bool pixtral = config["model_type"] == "mistral3";
  const Checkpoint ckpt = Checkpoint::open(dir);
  const int64_t image = vc["image_size"], patch = vc["patch_size"],
                layers = vc["num_hidden_layers"];
  const int64_t heads = vc["num_attention_heads"], hidden = vc["hidden_size"];
  GgufWriter g;
  g.str("general.architecture", "clip");
  g.boolean("clip.has_vision_encoder", true);
  g.str("clip.projector_type", !projector.empty() ? projector : pixtral ? "pixtral" : "gemma3");
  g.u32("clip.vision.image_size", uint32_t(image));
  g.u32("clip.vision.patch_size", uint32_t(patch));
  g.u32("clip.vision.embedding_length", uint32_t(hidden));
  g.u32("clip.vision.feed_forward_length", vc["intermediate_size"].get<uint32_t>());
  g.u32("clip.vision.block_count", uint32_t(layers));
  g.u32("clip.vision.attention.head_count", uint32_t(heads));
  g.u32("clip.vision.projection_dim", config["text_config"]["hidden_size"].get<uint32_t>());
  if (pixtral) {
    g.f32("clip.vision.attention.layer_norm_epsilon", 1e-5f);
    g.boolean(vc.value("hidden_act", "gelu") == "silu" ? "clip.use_silu" : "clip.use_gelu", true);
    g.u32("clip.vision.spatial_merge_size", config.value("spatial_merge_size", 2u));
    g.f32_array("clip.vision.image_mean", {0.48145466f, 0.4578275f, 0.40821073f});
    g.f32_array("clip.vision.image_std", {0.26862954f, 0.26130258f, 0.27577711f});
  } else {
    const int64_t per_side = std::lround(std::sqrt(config["mm_tokens_per_image"].get<double>()));
    g.f32("clip.vision.attention.layer_norm_epsilon", vc.value("layer_norm_eps", 1e-6f));
    g.u32("clip.vision.projector.scale_factor", uint32_t(image / patch / per_side));
    g.f32_array("clip.vision.image_mean", {0.5f, 0.5f, 0.5f});
    g.f32_array("clip.vision.image_std", {0.5f, 0.5f, 0.5f});
    g.boolean("clip.use_gelu", true);
  }

  // GGUF name <- checkpoint name; Gemma's soft-token norm gets + 1,
  // Pixtral's q/k rows llama.cpp's per-head permutation.
  auto put = [&](const std::string& gguf, const std::string& hf) {
    if (gguf == skip || !ckpt.has(hf)) return;
    const TensorView t = ckpt.get(hf);
    std::vector<float> v(size_t(t.numel()));
    convert_to_f32(t.data, t.dtype, t.numel(), v.data());
    if (gguf == "mm.soft_emb_norm.weight")
      for (float& x : v) x += 1.0f;
    std::vector<int64_t> dims(t.shape.rbegin(), t.shape.rend());
    const int64_t rows = t.numel() / dims[0];
    if (pixtral &&
        (gguf.find(".attn_q.") != std::string::npos || gguf.find(".attn_k.") != std::string::npos))
      v = permute_head_rows(v, rows, dims[0], hidden / heads);
    const bool matrix = t.shape.size() >= 2 && gguf.find("position_embd") == std::string::npos;
    GgmlType ty = matrix ? type : GgmlType::F32;
    if (dims[0] % ggml_block_values(ty) != 0) ty = GgmlType::F32;
    g.tensor(gguf, ty, dims, encode_rows(ty, v.data(), rows, dims[0]));
  };
  const std::string v = "vision_tower.", m = "multi_modal_projector.";
  put("v.patch_embd.weight",
      v + (pixtral ? "patch_conv.weight" : "embeddings.patch_embedding.weight"));
  if (pixtral) {
    put("v.pre_ln.weight", v + "ln_pre.weight");
    for (int64_t i = 0; i < layers; ++i) {
      const std::string b = "v.blk." + std::to_string(i) + ".",
                        l = v + "transformer.layers." + std::to_string(i) + ".";
      put(b + "attn_q.weight", l + "attention.q_proj.weight");
      put(b + "attn_k.weight", l + "attention.k_proj.weight");
      put(b + "attn_v.weight", l + "attention.v_proj.weight");
      put(b + "attn_out.weight", l + "attention.o_proj.weight");
      put(b + "ln1.weight", l + "attention_norm.weight");
      put(b + "ln2.weight", l + "ffn_norm.weight");
      put(b + "ffn_gate.weight", l + "feed_forward.gate_proj.weight");
      put(b + "ffn_up.weight", l + "feed_forward.up_proj.weight");
      put(b + "ffn_down.weight", l + "feed_forward.down_proj.weight");
    }
    put("mm.input_norm.weight", m + "norm.weight");
    put("mm.patch_merger.weight", m + "patch_merger.merging_layer.weight");
    for (const char* kind : {"weight", "bias"}) {
      put(std::string("mm.1.") + kind, m + "linear_1." + kind);
      put(std::string("mm.2.") + kind, m + "linear_2." + kind);
    }
    g.write(path);
    return;
  }
  put("v.patch_embd.bias", v + "embeddings.patch_embedding.bias");
  put("v.position_embd.weight", v + "embeddings.position_embedding.weight");
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = "v.blk." + std::to_string(i) + ".",
                      l = v + "encoder.layers." + std::to_string(i) + ".";
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = std::string(".") + kind;
      put(b + "attn_q" + k, l + "self_attn.q_proj" + k);
      put(b + "attn_k" + k, l + "self_attn.k_proj" + k);
      put(b + "attn_v" + k, l + "self_attn.v_proj" + k);
      put(b + "attn_out" + k, l + "self_attn.out_proj" + k);
      put(b + "ln1" + k, l + "layer_norm1" + k);
      put(b + "ln2" + k, l + "layer_norm2" + k);
      put(b + "ffn_up" + k, l + "mlp.fc1" + k);
      put(b + "ffn_down" + k, l + "mlp.fc2" + k);
    }
  }
  put("v.post_ln.weight", v + "post_layernorm.weight");
  put("v.post_ln.bias", v + "post_layernorm.bias");
  put("mm.input_projection.weight", m + "mm_input_projection_weight");
  put("mm.soft_emb_norm.weight", m + "mm_soft_emb_norm.weight");
  g.write(path);
}

}  // namespace tandem::test
