// Pieces the vision towers share: reading their tensors and config fields,
// cutting pixels into patches, and full (bidirectional) attention over the
// patches of one image.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/safetensors.h"

namespace tandem::vision {

// A tensor of `shape` as f32 (any float dtype), or Error naming it.
std::vector<float> read_f32(const Checkpoint& c, const std::string& name, const Shape& shape);
// A [rows, cols] weight viewed in place (dense, or MLX-quantized with
// .scales/.biases beside it), or Error naming it.
WeightMatrix read_matrix(const Checkpoint& c, const std::string& name, int64_t rows, int64_t cols);
// config["vision_config"], or Error: the checkpoint cannot take images.
const nlohmann::json& vision_config(const Checkpoint& c, const nlohmann::json& config);
// An integer field of a config object, or `fallback` when absent.
int64_t config_int(const nlohmann::json& j, const char* key, int64_t fallback);
// The first prefix under which `probe` (a tensor name without prefix)
// exists, or "" when none does.
std::string find_prefix(const Checkpoint& c, std::span<const char* const> prefixes,
                        const std::string& probe);

// Pixels [3, h, w] -> patches [rows·cols, 3·p·p] in (c, ky, kx) order,
// row-major over the patch grid: a conv with kernel = stride = p as a matmul.
std::vector<float> patches_chw(const float* pixels, int64_t h, int64_t w, int64_t p);

// out[t, head] = softmax(q[t]·k[j] · scale) v[j] over every patch j of the
// image, query head h reading kv head h / (heads / kv_heads). q, out:
// [n, heads·head_dim]; k, v: [n, kv_heads·head_dim].
void full_attention(ThreadPool& pool, const float* q, const float* k, const float* v, int64_t n,
                    int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, float* out);

}  // namespace tandem::vision
