#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_impl.h"

namespace tandem::cpu {

namespace detail {
namespace {

// The scalar references of the gated activations (kernels_impl.h).
void silu_mul_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void gelu_tanh_mul_scalar(float* gate, const float* up, int64_t n) {
  // 0.5·g·(1 + tanh(u)) = g / (1 + exp(-2u)), exactly: one expf instead of
  // tanhf (5x faster with glibc, and without the cancellation of 1 + tanh(u)
  // for negative u).
  const float k2 = 2.0f * 0.7978845608028654f;  // 2 sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-k2 * (g + 0.044715f * g * g * g))) * up[i];
  }
}

}  // namespace

const GatedKernels kScalarGated = {silu_mul_scalar, gelu_tanh_mul_scalar};

}  // namespace detail

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    const float* row = x + t * dim;
    float ss = dot(row, row, dim);
    float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    float* out = y + t * dim;
    if (w)
      for (int64_t i = 0; i < dim; ++i) out[i] = row[i] * inv * w[i];
    else
      for (int64_t i = 0; i < dim; ++i) out[i] = row[i] * inv;
  }
}

void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t dim, float eps,
               float* y) {
  for (int64_t t = 0; t < n; ++t) {
    const float* row = x + t * dim;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean += row[i];
    mean /= double(dim);
    for (int64_t i = 0; i < dim; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= double(dim);
    const float inv = float(1.0 / std::sqrt(var + eps)), m = float(mean);
    float* out = y + t * dim;
    for (int64_t i = 0; i < dim; ++i) out[i] = (row[i] - m) * inv * w[i] + b[i];
  }
}

void gelu_tanh(float* x, int64_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
  }
}

void gelu_erf(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.7071067811865476f));
}

void gelu_erf_mul(float* gate, const float* up, int64_t n) {
  gelu_erf(gate, n);
  for (int64_t i = 0; i < n; ++i) gate[i] *= up[i];
}

void silu_mul(float* gate, const float* up, int64_t n) {
  detail::gated_kernels().silu_mul(gate, up, n);
}

void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  detail::gated_kernels().gelu_tanh_mul(gate, up, n);
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void attention(ThreadPool& pool, const float* q, int64_t pos0, int64_t n, const AttentionParams& p,
               float* out) {
  const int64_t group = p.heads / p.kv_heads;
  const int64_t kv_dim = p.kv_heads * p.head_dim;
  const int64_t q_dim = p.heads * p.head_dim;
  const int64_t block_floats = p.block_size * kv_dim;
  // A task is (token, kv head, `sub` of its query heads): the heads of a
  // task read each key and value row once for all of them. The whole group
  // when that gives every thread two tasks; else halves of it (decode of a
  // model with one or two kv heads).
  int64_t sub = group;
  while (sub > 1 && n * p.kv_heads * ((group + sub - 1) / sub) < 2 * pool.size())
    sub = (sub + 1) / 2;
  const int64_t subs = (group + sub - 1) / sub;
  // Runs f(first position, count, rows at k_base's / v_base's offset) over
  // the positions [first, last], one run per KV block.
  auto for_runs = [&](int64_t first, int64_t last, auto&& f) {
    for (int64_t pos = first; pos <= last;) {
      const int64_t end = std::min(last + 1, (pos / p.block_size + 1) * p.block_size);
      const int64_t b = p.blocks[pos / p.block_size - p.first_block];
      f(pos, end - pos, b * block_floats + (pos % p.block_size) * kv_dim);
      pos = end;
    }
  };
  pool.parallel_for(n * p.kv_heads * subs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [heads of the task][keys]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / (p.kv_heads * subs), kvh = task / subs % p.kv_heads;
      const int64_t h0 = kvh * group + task % subs * sub;
      const int nq = int(std::min(sub, kvh * group + group - h0));
      const int64_t pos = pos0 + t;
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      const int64_t last = p.key_end ? p.key_end[t] - 1 : pos;
      const int64_t count = last - first + 1;
      const float* qh = q + t * q_dim + h0 * p.head_dim;
      float* oh = out + t * q_dim + h0 * p.head_dim;
      scores.resize(size_t(nq * count));
      for_runs(first, last, [&](int64_t at, int64_t keys, int64_t offset) {
        attention_scores(qh, nq, p.head_dim, p.k_base + offset + kvh * p.head_dim, kv_dim, keys,
                         p.head_dim, p.scale, scores.data() + (at - first), count);
      });
      for (int g = 0; g < nq; ++g) {
        float* sg = scores.data() + g * count;
        if (p.softcap > 0.0f)
          for (int64_t j = 0; j < count; ++j) sg[j] = p.softcap * std::tanh(sg[j] / p.softcap);
        const float max_score = *std::max_element(sg, sg + count);
        const float inv_sum = 1.0f / exp_shifted_sum(sg, count, max_score);
        for (int64_t j = 0; j < count; ++j) sg[j] *= inv_sum;
      }
      std::fill(oh, oh + nq * p.head_dim, 0.0f);
      for_runs(first, last, [&](int64_t at, int64_t keys, int64_t offset) {
        attention_values(scores.data() + (at - first), nq, count,
                         p.v_base + offset + kvh * p.head_dim, kv_dim, keys, p.head_dim, oh,
                         p.head_dim);
      });
    }
  });
}

}  // namespace tandem::cpu
