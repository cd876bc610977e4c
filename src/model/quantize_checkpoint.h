// `tandem quantize`: a checkpoint folder rewritten as MLX affine-quantized
// safetensors, loadable by tandem and by mlx-lm / mlx-vlm.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct QuantizeStats {
  int64_t quantized = 0;   // matrices written as codes + scales + biases
  int64_t kept = 0;        // tensors copied (or, FP8, dequantized to bf16) unquantized
  uint64_t bytes_in = 0;   // tensor bytes read
  uint64_t bytes_out = 0;  // tensor bytes written
};

// Reads IN_DIR (dense F32/F16/BF16 or FP8 e4m3 with weight_scale_inv) and
// writes OUT_DIR/model.safetensors, OUT_DIR/config.json and a copy of every
// other file (tokenizer, templates, processor configs).
//
// Quantized, as MLX's default predicate does: every 2-D "*.weight" of the
// language model (linears, embeddings, the head) whose row length group_size
// divides; norms, biases, vectors, vision towers and projectors stay as they
// are (FP8 ones are dequantized to bf16). A module M becomes M.weight (U32
// codes), M.scales and M.biases (in the weight's dtype; bf16 for FP8), per
// core/quant.h's affine_quantize_row. config.json gains "quantization" and
// "quantization_config": {"group_size", "bits", "mode": "affine"} (an FP8
// quantization_config is replaced). Throws Error on an already quantized
// input, bits other than 4/8, group sizes other than 32/64/128, or
// OUT_DIR == IN_DIR.
QuantizeStats quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, int bits,
                                  int group_size);

}  // namespace tandem
