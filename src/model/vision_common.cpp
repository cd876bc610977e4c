#include "model/vision_common.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "model/quantized.h"

namespace tandem::vision {

std::vector<float> read_f32(const Checkpoint& c, const std::string& name, const Shape& shape) {
  TensorView t = c.require(name, shape);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, t.numel(), v.data());
  return v;
}

WeightMatrix read_matrix(const Checkpoint& c, const std::string& name, int64_t rows, int64_t cols) {
  // A tower quantized by MLX (mlx-vlm can): viewed in place, matmul takes it.
  if (c.has(module_of(name) + ".scales")) return view_affine(c, name, rows, cols);
  TensorView t = c.require(name, {rows, cols});
  return WeightMatrix{t.dtype, t.data, rows, cols};
}

const nlohmann::json& vision_config(const Checkpoint& c, const nlohmann::json& config) {
  if (!config.contains("vision_config") || !config["vision_config"].is_object())
    fail("%s: config.json has no vision_config, so this checkpoint cannot take images",
         c.dir().c_str());
  return config["vision_config"];
}

int64_t config_int(const nlohmann::json& j, const char* key, int64_t fallback) {
  return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : fallback;
}

std::string find_prefix(const Checkpoint& c, std::span<const char* const> prefixes,
                        const std::string& probe) {
  for (const char* p : prefixes)
    if (c.has(std::string(p) + probe)) return p;
  return "";
}

std::vector<float> patches_chw(const float* pixels, int64_t h, int64_t w, int64_t p) {
  const int64_t rows = h / p, cols = w / p;
  std::vector<float> out(static_cast<size_t>(rows * cols * 3 * p * p));
  float* dst = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t y = 0; y < p; ++y)
          for (int64_t x = 0; x < p; ++x) *dst++ = pixels[(ch * h + r * p + y) * w + c * p + x];
  return out;
}

void full_attention(ThreadPool& pool, const float* q, const float* k, const float* v, int64_t n,
                    int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, float* out) {
  const int64_t stride = heads * head_dim, kv_stride = kv_heads * head_dim,
                group = heads / kv_heads;
  pool.parallel_for(n * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(n));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / heads, hd = task % heads;
      const float* qt = q + t * stride + hd * head_dim;
      const int64_t kv = (hd / group) * head_dim;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        scores[size_t(j)] = cpu::dot(qt, k + j * kv_stride + kv, head_dim) * scale;
        mx = std::max(mx, scores[size_t(j)]);
      }
      float sum = 0.0f;
      for (float& s : scores) sum += (s = std::exp(s - mx));
      float* o = out + t * stride + hd * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t j = 0; j < n; ++j)
        cpu::axpy(scores[size_t(j)] / sum, v + j * kv_stride + kv, o, head_dim);
    }
  });
}

}  // namespace tandem::vision
