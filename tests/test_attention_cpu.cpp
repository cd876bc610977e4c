// The CPU attention (backend/cpu/ops.h) against a double-precision
// reference over paged KV rows: grouped query heads (one to eight a kv
// head), head dims off the SIMD width, sliding windows, soft-capping and
// bidirectional key ranges, on every ISA path and with 1 or 2 threads (which
// changes how a kv head's query heads are split into tasks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "core/thread_pool.h"

using namespace tandem;

namespace {

struct Case {
  int64_t heads, kv_heads, head_dim, pos0, n;
  int64_t window = 0;
  float softcap = 0.0f;
  bool bidirectional = false;  // tokens see keys up to the end of their group of 5
};

// Softmax-weighted values of one (token, head) in double precision.
std::vector<double> reference_row(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const Case& c, int64_t t, int64_t h,
                                  int64_t first, int64_t last, float scale) {
  const int64_t Dh = c.head_dim, kvh = h / (c.heads / c.kv_heads);
  const int64_t kv_dim = c.kv_heads * Dh;
  std::vector<double> s;
  for (int64_t j = first; j <= last; ++j) {
    double d = 0;
    for (int64_t i = 0; i < Dh; ++i)
      d += double(q[size_t(t * c.heads * Dh + h * Dh + i)]) * k[size_t(j * kv_dim + kvh * Dh + i)];
    d *= scale;
    if (c.softcap > 0) d = c.softcap * std::tanh(d / c.softcap);
    s.push_back(d);
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(size_t(Dh), 0.0);
  for (int64_t j = first; j <= last; ++j)
    for (int64_t i = 0; i < Dh; ++i)
      out[size_t(i)] += s[size_t(j - first)] / sum * v[size_t(j * kv_dim + kvh * Dh + i)];
  return out;
}

void check(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t Dh = c.head_dim, kv_dim = c.kv_heads * Dh, total = c.pos0 + c.n;
  const int64_t block = 16, nblocks = (total + block - 1) / block;
  std::vector<float> q(size_t(c.n * c.heads * Dh)), k(size_t(total * kv_dim)),
      v(size_t(total * kv_dim));
  for (auto* vec : {&q, &k, &v})
    for (float& x : *vec) x = dist(rng);
  // The rows in shuffled blocks of the pool.
  std::vector<int32_t> table(static_cast<size_t>(nblocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<float> kp(size_t(nblocks * block * kv_dim)), vp(kp.size());
  for (int64_t pos = 0; pos < total; ++pos) {
    const int64_t at = (table[size_t(pos / block)] * block + pos % block) * kv_dim;
    std::copy_n(k.begin() + pos * kv_dim, kv_dim, kp.begin() + at);
    std::copy_n(v.begin() + pos * kv_dim, kv_dim, vp.begin() + at);
  }
  std::vector<int64_t> key_end(size_t(c.n));
  for (int64_t t = 0; t < c.n; ++t) key_end[size_t(t)] = std::min(total, c.pos0 + (t / 5 + 1) * 5);

  cpu::AttentionParams p;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = Dh;
  p.scale = 1.0f / std::sqrt(float(Dh));
  p.softcap = c.softcap;
  p.window = c.window;
  p.k_base = kp.data();
  p.v_base = vp.data();
  p.blocks = table.data();
  p.block_size = block;
  p.key_end = c.bidirectional ? key_end.data() : nullptr;

  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (!cpu::set_isa_for_testing(isa)) continue;
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::vector<float> out(q.size(), NAN);
      cpu::attention(pool, q.data(), c.pos0, c.n, p, out.data());
      for (int64_t t = 0; t < c.n; ++t)
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t pos = c.pos0 + t;
          const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
          const int64_t last = c.bidirectional ? key_end[size_t(t)] - 1 : pos;
          const std::vector<double> want = reference_row(q, k, v, c, t, h, first, last, p.scale);
          for (int64_t i = 0; i < Dh; ++i) {
            const float got = out[size_t(t * c.heads * Dh + h * Dh + i)];
            ASSERT_NEAR(got, want[size_t(i)], 2e-5 * (1 + std::fabs(want[size_t(i)])))
                << isa << " threads " << threads << " heads " << c.heads << "/" << c.kv_heads
                << " dim " << Dh << " token " << t << " head " << h << " element " << i;
          }
        }
    }
  }
  cpu::set_isa_for_testing("");
}

}  // namespace

TEST(CpuAttention, GroupedHeadsOverPagedRowsMatchTheReference) {
  uint32_t seed = 1;
  for (int64_t dim : {64, 72, 128, 256})
    for (auto [heads, kv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 1}, {8, 2}, {6, 2}, {8, 1}})
      for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 23}, {37, 1}, {40, 9}})
        check(Case{heads, kv, dim, pos0, n}, seed++);
}

TEST(CpuAttention, WindowsSoftcapAndBidirectionalRangesMatchTheReference) {
  check(Case{4, 2, 64, 30, 20, /*window=*/7}, 101);
  check(Case{8, 1, 256, 5, 33, /*window=*/16}, 102);
  check(Case{4, 1, 128, 0, 40, 0, /*softcap=*/30.0f}, 103);
  check(Case{4, 2, 72, 3, 21, 0, 0.0f, /*bidirectional=*/true}, 104);
  check(Case{16, 8, 64, 1, 1}, 105);  // one decode token: 8 tasks of 2 heads
}

// Prefill steps on AVX-512 take the tiles (kernels.h's attention_tile, head
// dims 64-512): rows of several tokens and heads, groups wider than a tile,
// KV blocks entered mid-way, windows and image ranges across tiles.
TEST(CpuAttention, PrefillTilesMatchTheReference) {
  check(Case{4, 1, 512, 0, 37}, 201);                  // Gemma 4's global layers
  check(Case{32, 1, 64, 3, 6}, 202);                   // 32 heads: two slices a token
  check(Case{6, 2, 128, 11, 50}, 203);                 // 3 heads: 5 tokens a tile
  check(Case{8, 1, 256, 90, 70, /*window=*/40}, 204);  // Gemma 3's sliding layers
  check(Case{4, 2, 128, 7, 44, 0, 0.0f, /*bidirectional=*/true}, 205);
  check(Case{4, 4, 64, 0, 4}, 206);  // the fewest tokens a tile takes
  check(Case{2, 1, 256, 500, 130, /*window=*/512, 0.0f, true}, 207);
}

// Decode steps (1-3 tokens) past 512 positions split each token's keys in
// ranges of whole KV blocks for every head, merged at the end.
TEST(CpuAttention, LongDecodeKeyRangesMatchTheReference) {
  check(Case{4, 1, 256, 700, 1}, 301);
  check(Case{32, 8, 64, 1500, 1}, 302);
  check(Case{6, 2, 72, 999, 3}, 303);                   // a dim off the tiles'
  check(Case{8, 1, 256, 900, 2, /*window=*/512}, 304);  // a sliding layer
  check(Case{4, 2, 128, 600, 1, 0, /*softcap=*/30.0f}, 305);
  check(Case{4, 2, 64, 520, 3, 0, 0.0f, /*bidirectional=*/true}, 306);
}

TEST(CpuAttention, ExpShiftedSumIsExpfToAFewUlps) {
  // Softmax arguments: from 0 down past f32's smallest exp (e^-104 = 0).
  std::vector<float> x;
  for (float v = 0.0f; v > -110.0f; v -= 0.0137f) x.push_back(v);
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (!cpu::set_isa_for_testing(isa)) continue;
    for (float shift : {0.0f, 2.5f}) {
      std::vector<float> y = x;
      const float sum = cpu::exp_shifted_sum(y.data(), int64_t(y.size()), shift);
      double want_sum = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double want = std::exp(double(x[i] - shift));
        want_sum += want;
        // 4 ulps above the normal range; below it, within the smallest normal.
        ASSERT_NEAR(y[i], want, std::max(4 * 1.2e-7 * want, 1.2e-38))
            << isa << " exp(" << x[i] << " - " << shift << ")";
      }
      // A NaN score stays NaN (a broken activation must not turn into a weight).
      std::vector<float> bad = {0.0f, NAN, -1.0f};
      cpu::exp_shifted_sum(bad.data(), 3, 0.0f);
      EXPECT_TRUE(std::isnan(bad[1])) << isa;
      // An f32 sum of n terms: within n rounding steps.
      EXPECT_NEAR(sum, want_sum, double(x.size()) * 1.2e-7 * want_sum) << isa;
    }
  }
  cpu::set_isa_for_testing("");
}
