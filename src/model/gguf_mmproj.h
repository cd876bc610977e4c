// A llama.cpp `mmproj` GGUF (a vision tower and projector on its own) made
// to look like the vision half of a transformers checkpoint, so the
// existing towers (model/vision_gemma3.h, ...) load it unchanged:
//
//   clip.* metadata  -> a config.json object (model_type, vision_config,
//                       mm_tokens_per_image, ...) and a
//                       preprocessor_config.json object (image_mean/std)
//   GGUF tensor names -> transformers names, in a Checkpoint over the file's
//                        mapping (Checkpoint::from_memory)
//
// Projector types (clip.projector_type): "gemma3" (SigLIP + Gemma 3's
// pooled RMSNorm + linear projector) and "pixtral" (Pixtral + Mistral 3's
// patch merger and two linears). Conventions of llama.cpp's converter
// (convert_hf_to_gguf.py, clip.cpp) undone or taken as they are:
//  - conv and matrix weights keep PyTorch's layout (ggml dims innermost
//    first = the row-major shape reversed), so v.patch_embd.weight is OIHW
//    and mm.input_projection.weight is [vision hidden, text hidden] as in
//    transformers;
//  - gemma3: mm.soft_emb_norm.weight is stored as 1 + w (the config says so
//    with "tandem_soft_emb_norm_plus_one", and the tower does not add 1
//    again); SigLIP's fc1 / fc2 are ffn_up / ffn_down; tokens per image =
//    (image_size / patch_size / k)², k = clip.vision.projector.scale_factor
//    (default 4, llama.cpp's);
//  - pixtral: attn_q / attn_k rows are permuted per head for interleaved
//    RoPE (as for llama text models) and are permuted back; RoPE theta is
//    clip.vision.rope.freq_base, else 10000; clip.use_silu picks the MLP
//    activation (else GELU); the projector activation is GELU and its
//    biases are used when mm.1.bias is present; v.token_embd.img_break is
//    ignored (the [IMG_BREAK] token comes from the text model).
// Tensor types: F32, F16, BF16 viewed in the mapping (zero-copy); Q8_0,
// Q4_0, Q4_K, Q6_K — and permuted rows — copied to F32 at load (exact). The
// image token ids are not in an mmproj: the caller takes them from the text
// model. Unknown tensors are ignored; every tensor the tower needs is checked
// by its GGUF name before anything is read.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/safetensors.h"

namespace tandem {

struct MmprojTower {
  std::string path;
  std::string projector;        // clip.projector_type
  Checkpoint checkpoint;        // transformers names over the file's tensors
  nlohmann::json config;        // config.json-shaped (no token ids)
  nlohmann::json preprocessor;  // preprocessor_config.json-shaped
  size_t tensor_bytes = 0;      // bytes of the file's tensors
  int64_t projection_dim = 0;   // clip.vision.projection_dim (the text width), 0 if absent
};

// Opens and translates an mmproj file. Throws Error naming the file and the
// key or tensor at fault: not a GGUF, no vision encoder, a projector type
// tandem does not run, a missing key or tensor (by its GGUF name), a tensor
// type it cannot read.
MmprojTower open_mmproj(const std::string& path);

}  // namespace tandem
