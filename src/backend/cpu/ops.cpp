#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
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

namespace {

// Steps of at least this many tokens of a sequence take attention_tiles;
// fewer, past kKeyRangesMinKeys positions, attention_key_ranges.
constexpr int64_t kTileMinTokens = 4;
constexpr int64_t kKeyRangesMinKeys = 512;

// The positions [first, last] token t (at pos0 + t) attends: its window (or
// every earlier one), up to itself or its image's end (key_end).
std::pair<int64_t, int64_t> key_range(const AttentionParams& p, int64_t pos0, int64_t t) {
  const int64_t pos = pos0 + t;
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
  return {first, p.key_end ? p.key_end[t] - 1 : pos};
}

// Runs f(first position, count, offset of its rows from k_base / v_base)
// over the positions [k0, k1), one run per KV block. prefetch: also fetch
// the next block of that base ahead of f (null: none).
template <typename F>
void for_block_runs(const AttentionParams& p, int64_t k0, int64_t k1, const float* prefetch,
                    F&& f) {
  const int64_t kv_dim = p.kv_heads * p.head_dim, block_floats = p.block_size * kv_dim;
  for (int64_t pos = k0; pos < k1;) {
    const int64_t stop = std::min(k1, (pos / p.block_size + 1) * p.block_size);
    if (prefetch && stop < k1) {
      const float* next = prefetch + p.blocks[stop / p.block_size - p.first_block] * block_floats;
      for (int64_t i = 0; i < block_floats; i += 16) __builtin_prefetch(next + i, 0, 3);
    }
    const int64_t b = p.blocks[pos / p.block_size - p.first_block];
    f(pos, stop - pos, b * block_floats + (pos % p.block_size) * kv_dim);
    pos = stop;
  }
}

// Prefill attention on attention_tile: a task is one kv head and up to
// kTileRows query rows — consecutive tokens' query heads of that kv head
// (kTileRows / group tokens a task), or a slice of one token's heads when
// the group is larger — which score each KV block once for all of them.
void attention_tiles(ThreadPool& pool, const float* q, int64_t pos0, int64_t n,
                     const AttentionParams& p, float* out) {
  const int64_t group = p.heads / p.kv_heads, dim = p.head_dim;
  const int64_t kv_dim = p.kv_heads * dim, q_dim = p.heads * dim;
  const int64_t block_floats = p.block_size * kv_dim;
  const int64_t tokens = group >= kTileRows ? 1 : kTileRows / group;  // a task's tokens
  const int64_t slices = (group + kTileRows - 1) / kTileRows;         // a token's head slices
  const int64_t per_head = (n + tokens - 1) / tokens * slices;        // tasks of a kv head
  pool.parallel_for(p.kv_heads * per_head, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    scratch.resize(attention_tile_floats(dim));
    std::vector<KeyBlock> blocks;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kvh = task / per_head, i = task % per_head;
      const int64_t t0 = i / slices * tokens, t1 = std::min(n, t0 + tokens);
      const int64_t g0 = i % slices * kTileRows, g1 = std::min(group, g0 + kTileRows);
      TileRows rows;
      int64_t lo = INT64_MAX, hi = 0;  // the keys any row attends
      for (int64_t t = t0; t < t1; ++t) {
        const auto [first, last] = key_range(p, pos0, t);
        lo = std::min(lo, first);
        hi = std::max(hi, last);
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t h = kvh * group + g;
          rows.q[rows.count] = q + t * q_dim + h * dim;
          rows.out[rows.count] = out + t * q_dim + h * dim;
          rows.first[rows.count] = int32_t(first);
          rows.last[rows.count] = int32_t(last);
          ++rows.count;
        }
      }
      blocks.clear();
      for (int64_t b = lo / p.block_size; b <= hi / p.block_size; ++b) {
        const int64_t at = p.blocks[b - p.first_block] * block_floats + kvh * dim;
        const int64_t start = b * p.block_size;
        blocks.push_back({p.k_base + at, p.v_base + at, int32_t(start),
                          int32_t(std::max<int64_t>(0, lo - start)),
                          int32_t(std::min(p.block_size, hi + 1 - start))});
      }
      attention_tile(rows, blocks.data(), int64_t(blocks.size()), kv_dim, dim, p.scale,
                     scratch.data());
    }
  });
}

// Decode attention over long contexts: a task is one token's keys in a
// range of whole KV blocks, for every head, so that it reads whole K and V
// rows in order (a task per kv head read 256 of every 2,048 bytes of a
// llama-3.2-1B row, and at 4,096 positions the attention took a third of a
// decode step at ~7 GB/s). Each task leaves per head its max score, the sum
// of its e^(s - max) and the sum of those times the values; the token's
// ranges are then merged under their common max.
void attention_key_ranges(ThreadPool& pool, const float* q, int64_t pos0, int64_t n,
                          const AttentionParams& p, float* out) {
  const int64_t group = p.heads / p.kv_heads, dim = p.head_dim, heads = p.heads;
  const int64_t kv_dim = p.kv_heads * dim, q_dim = heads * dim;
  // Keys a task: enough tasks for two per thread, at least 16 blocks each.
  int64_t most = 0;
  for (int64_t t = 0; t < n; ++t) {
    const auto [first, last] = key_range(p, pos0, t);
    most = std::max(most, last - first + 1);
  }
  const int64_t per_token = std::max<int64_t>(1, 2 * pool.size() / n);
  const int64_t span =
      std::max<int64_t>(16 * p.block_size, ((most + per_token - 1) / per_token + p.block_size - 1) /
                                               p.block_size * p.block_size);
  // Tasks: token t's ranges [first + c·span, ...), c < ranges(t).
  std::vector<int64_t> task_begin(size_t(n) + 1, 0);
  for (int64_t t = 0; t < n; ++t) {
    const auto [first, last] = key_range(p, pos0, t);
    task_begin[size_t(t) + 1] = task_begin[size_t(t)] + (last - first + span) / span;
  }
  const int64_t tasks = task_begin[size_t(n)];
  // Per task and head: max, sum, and dim weighted values.
  std::vector<float> partial(size_t(tasks * heads * (dim + 2)));
  pool.parallel_for(tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [heads][keys of the task]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t =
          std::upper_bound(task_begin.begin(), task_begin.end(), task) - task_begin.begin() - 1;
      const auto [first, last] = key_range(p, pos0, t);
      const int64_t k0 = first + (task - task_begin[size_t(t)]) * span;
      const int64_t k1 = std::min(last + 1, k0 + span), count = k1 - k0;
      scores.resize(size_t(heads * count));
      // The next block prefetched: the heads' passes over a block jump
      // between rows, which the hardware prefetchers do not follow.
      const float* qt = q + t * q_dim;
      for_block_runs(p, k0, k1, p.k_base, [&](int64_t at, int64_t keys, int64_t offset) {
        for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh)
          attention_scores(qt + kvh * group * dim, int(group), dim, p.k_base + offset + kvh * dim,
                           kv_dim, keys, dim, p.scale,
                           scores.data() + kvh * group * count + (at - k0), count);
      });
      float* part = partial.data() + task * heads * (dim + 2);
      for (int64_t h = 0; h < heads; ++h) {
        float* sh = scores.data() + h * count;
        if (p.softcap > 0.0f)
          for (int64_t j = 0; j < count; ++j) sh[j] = p.softcap * std::tanh(sh[j] / p.softcap);
        part[h * (dim + 2)] = *std::max_element(sh, sh + count);
        part[h * (dim + 2) + 1] = exp_shifted_sum(sh, count, part[h * (dim + 2)]);
        std::fill_n(part + h * (dim + 2) + 2, dim, 0.0f);
      }
      for_block_runs(p, k0, k1, p.v_base, [&](int64_t at, int64_t keys, int64_t offset) {
        for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh)
          attention_values(scores.data() + kvh * group * count + (at - k0), int(group), count,
                           p.v_base + offset + kvh * dim, kv_dim, keys, dim,
                           part + kvh * group * (dim + 2) + 2, dim + 2);
      });
    }
  });
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float top = -INFINITY;
      for (int64_t c = task_begin[size_t(t)]; c < task_begin[size_t(t) + 1]; ++c)
        top = std::max(top, partial[size_t((c * heads + h) * (dim + 2))]);
      float sum = 0.0f;
      float* o = out + t * q_dim + h * dim;
      std::fill_n(o, dim, 0.0f);
      for (int64_t c = task_begin[size_t(t)]; c < task_begin[size_t(t) + 1]; ++c) {
        const float* part = partial.data() + (c * heads + h) * (dim + 2);
        const float w = std::exp(part[0] - top);
        sum += w * part[1];
        for (int64_t i = 0; i < dim; ++i) o[i] += w * part[2 + i];
      }
      for (int64_t i = 0; i < dim; ++i) o[i] /= sum;
    }
}

}  // namespace

void attention(ThreadPool& pool, const float* q, int64_t pos0, int64_t n, const AttentionParams& p,
               float* out) {
  // Several tokens (prefill) take the tiles where this processor has them:
  // on the 2-core EPYC llama-3.2-1B shapes prefill 4,096 tokens at 201 tok/s
  // instead of 115, 2,048 at 262-271 instead of 200. Soft-capped scores and
  // decode steps take the per-token path below.
  if (n >= kTileMinTokens && p.softcap == 0.0f && p.block_size == kTileRows &&
      pos0 + n < INT32_MAX && attention_tile_supported(p.head_dim))
    return attention_tiles(pool, q, pos0, n, p, out);
  if (n < kTileMinTokens && pos0 + n >= kKeyRangesMinKeys)
    return attention_key_ranges(pool, q, pos0, n, p, out);
  const int64_t group = p.heads / p.kv_heads;
  const int64_t kv_dim = p.kv_heads * p.head_dim;
  const int64_t q_dim = p.heads * p.head_dim;
  // A task is (token, kv head, `sub` of its query heads): the heads of a
  // task read each key and value row once for all of them. The whole group
  // when that gives every thread two tasks; else halves of it (decode of a
  // model with one or two kv heads).
  int64_t sub = group;
  while (sub > 1 && n * p.kv_heads * ((group + sub - 1) / sub) < 2 * pool.size())
    sub = (sub + 1) / 2;
  const int64_t subs = (group + sub - 1) / sub;
  pool.parallel_for(n * p.kv_heads * subs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [heads of the task][keys]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / (p.kv_heads * subs), kvh = task / subs % p.kv_heads;
      const int64_t h0 = kvh * group + task % subs * sub;
      const int nq = int(std::min(sub, kvh * group + group - h0));
      const auto [first, last] = key_range(p, pos0, t);
      const int64_t count = last - first + 1;
      const float* qh = q + t * q_dim + h0 * p.head_dim;
      float* oh = out + t * q_dim + h0 * p.head_dim;
      scores.resize(size_t(nq * count));
      for_block_runs(p, first, last + 1, nullptr, [&](int64_t at, int64_t keys, int64_t offset) {
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
      for_block_runs(p, first, last + 1, nullptr, [&](int64_t at, int64_t keys, int64_t offset) {
        attention_values(scores.data() + (at - first), nq, count,
                         p.v_base + offset + kvh * p.head_dim, kv_dim, keys, p.head_dim, oh,
                         p.head_dim);
      });
    }
  });
}

}  // namespace tandem::cpu
