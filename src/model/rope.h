// Rotary position embeddings: inverse frequencies per RoPE type (computed in
// f32 exactly as transformers computes them) and the rotate-half application.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace tandem {

struct RopeTable {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  int64_t rotary_dim = 0;       // leading dims of each head that rotate
  float attention_scaling = 1;  // multiplies cos and sin (yarn)
};

// Builds the table of `spec` for heads of `head_dim` dims; throws Error on
// parameters that make no sense (e.g. llama3 factors that divide by zero).
RopeTable make_rope_table(const RopeSpec& spec, int64_t head_dim);

// Rotates `n_heads` consecutive heads of `head_dim` floats in place for
// position `pos` (rotate-half pairing: dim i with dim i + rotary_dim / 2).
void apply_rope(const RopeTable& table, int64_t pos, float* x, int64_t n_heads, int64_t head_dim);

}  // namespace tandem
