// Affine 4/8-bit weights on the GPU against the CPU's dequantization
// (core/quant.h dequantize_row, the reference):
//  - gemv_affine (int8 activations, the CPU's method): against the
//    dequantized weights times the activations quantized the same way
//    (gemv_reference.h quantize_row), |gpu - ref| ≤ 1e-5 · Σ|w·x| + 1e-6
//    (f32 sums in another order), and against the exact f32 product within
//    the activations' rounding, Σ |w| · d / 2; bits 4 and 8, groups
//    32/64/128, batches 1, 3 and 9, up to 8,192 columns; and with each
//    fusion (input norm, bias, residual add, gated activation) against the
//    unfused math in double (gemv_reference.h states the bound); and the
//    gated GEMV quantizing the down projection's input in its epilogue
//    (GemvFusion::quantized_out) against the unfused pair;
//  - dequantize_affine_bf16 and embed_rows_affine: bit-exact;
//  - cuda::Decoder on on-load-quantized fixtures with
//    TANDEM_CUDA_PACKED_QUANT=1 (4- and 8-bit matrices stay packed on the device:
//    4-bit weights take fewer bytes than 8-bit ones): GEMV steps (int8
//    activations) against the CPU decoder on the same quantized model with
//    its int8 activations (the same method) within 1e-4 × std (measured on
//    the H200 up to 2.7e-6), Gemma 4 0.3 (measured up to 0.15: GPU and CPU
//    values a few ulp apart — a norm summed in another order — that sit at a
//    rounding tie quantize one step apart, and the tiny random Gemma 4
//    amplifies that: int8 activations at all move its logits by 1.1-1.2 ×
//    std, the other fixtures' by 0.06-0.1); prefill steps through bf16
//    hi + lo tiles of the dequantized weights (one tile a matrix, and
//    300-weight tiles: TANDEM_CUDA_DEQUANT_TILE_WEIGHTS; 16 significant bits; bf16
//    tiles alone were 0.5 × std off on Gemma 4) against the CPU's exact f32
//    activations (its reference path) within 1e-3 × std, Gemma 4 2e-3
//    (measured 1.05e-3), as the bf16 fixtures' prefill with the tensor-core
//    attention (these random fixtures amplify rounding more than real models
//    do).
// Skipped, with the reason printed, where no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cuda/decoder.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "gemv_reference.h"
#include "model/decoder.h"
#include "model/kv_pool.h"

using namespace tandem;
using namespace tandem::cuda_test;

namespace {

// A random affine matrix on the host (f32 scales and biases) and its copy on
// the device.
struct RandomAffine {
  std::vector<uint32_t> words;
  std::vector<float> scales, biases;
  WeightMatrix host;
  cuda::DeviceBuffer d_words, d_scales, d_biases;
  cuda::AffineMatrix dev;

  RandomAffine(int bits, int group, int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 rng(seed);
    words.resize(size_t(rows * cols * bits / 32));
    for (uint32_t& w : words) w = rng();
    std::normal_distribution<float> d(0.f, 0.05f);
    scales.resize(size_t(rows * cols / group));
    biases.resize(scales.size());
    for (float& s : scales) s = std::fabs(d(rng)) + 1e-3f;
    for (float& b : biases) b = d(rng);
    host.dtype = DType::F32;
    host.data = words.data();
    host.rows = rows;
    host.cols = cols;
    host.format = WeightFormat::Affine;
    host.bits = bits;
    host.group_size = group;
    host.scales = scales.data();
    host.biases = biases.data();
    d_words = upload(words);
    d_scales = upload(scales);
    d_biases = upload(biases);
    dev = cuda::AffineMatrix{d_words.as<uint32_t>(),
                             d_scales.as<float>(),
                             d_biases.as<float>(),
                             bits,
                             group,
                             rows,
                             cols};
  }
  std::vector<float> row(int64_t r) const {
    std::vector<float> out(size_t(host.cols));
    dequantize_row(host, r, out.data());
    return out;
  }
};

TEST(CudaQuant, GemvMatchesTheDequantizedReference) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  const int64_t rows = 37;
  // Fewer 16-byte vectors than lanes; Gemma 3 1B's width; a down projection.
  for (int64_t cols : {384, 1152, 8192})
    for (int bits : {4, 8})
      for (int group : {32, 64, 128})
        for (int64_t n : {1, 3, 9}) {
          RandomAffine w(bits, group, rows, cols, uint32_t(bits * 1000 + group + n + cols));
          std::mt19937 rng(7);
          std::normal_distribution<float> d(0.f, 1.f);
          std::vector<float> x(size_t(n * cols));
          for (float& v : x) v = d(rng);
          auto dx = upload(x);
          // The references, once for both ways of quantizing the activations:
          // against the dequantized weights times the int8 activations (ref,
          // with the magnitude mag of its terms) and against the f32 product
          // (exact, within `rounding` of the activations' int8 rounding).
          std::vector<QuantizedRow> xq;
          std::vector<double> half_step(size_t(n * cols));  // d / 2 of each value's block
          for (int64_t t = 0; t < n; ++t) {
            xq.push_back(quantize_row(
                std::vector<double>(x.begin() + t * cols, x.begin() + (t + 1) * cols)));
            for (int64_t b = 0; b < cols; b += 32) {
              double amax = 0;
              for (int64_t c = b; c < b + 32; ++c)
                amax = std::max(amax, std::fabs(double(x[size_t(t * cols + c)])));
              for (int64_t c = b; c < b + 32; ++c) half_step[size_t(t * cols + c)] = amax / 254;
            }
          }
          std::vector<double> ref(size_t(n * rows)), mag(ref.size()), exact(ref.size()),
              rounding(ref.size());
          for (int64_t r = 0; r < rows; ++r) {
            const std::vector<float> wr = w.row(r);
            for (int64_t t = 0; t < n; ++t) {
              const size_t at = size_t(t * rows + r);
              for (int64_t c = 0; c < cols; ++c) {
                const double wv = wr[size_t(c)], xv = x[size_t(t * cols + c)];
                const double q = xq[size_t(t)].value[size_t(c)];
                ref[at] += wv * q;
                mag[at] += std::fabs(wv * q);
                exact[at] += wv * xv;
                rounding[at] += std::fabs(wv) * half_step[size_t(t * cols + c)];
              }
            }
          }
          cuda::DeviceBuffer dy(size_t(n * rows) * 4);
          cuda::gemv_affine(w.dev, dx.as<float>(), n, dy.as<float>(), nullptr);
          const auto got = download<float>(dy, size_t(n * rows));
          int bad = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t t = 0; t < n; ++t) {
              const size_t at = size_t(t * rows + r);
              const double g = got[at];
              if (std::fabs(g - ref[at]) > 1e-5 * mag[at] + 1e-6 && bad++ < 3)
                ADD_FAILURE() << bits << "-bit group " << group << " cols " << cols << " n " << n
                              << " [" << t << ", " << r << "] gpu " << g << " ref " << ref[at];
              // The rounding of the activations alone: each q · d within d / 2
              // of x (d = max|x| / 127 of its block), so the product within
              // Σ |w| · d / 2 of the exact one.
              if (std::fabs(g - exact[at]) > rounding[at] + 1e-5 * mag[at] + 1e-6 && bad++ < 3)
                ADD_FAILURE() << bits << "-bit group " << group << " cols " << cols << " n " << n
                              << " [" << t << ", " << r << "] gpu " << g << " f32 product "
                              << exact[at] << " beyond the int8 rounding " << rounding[at];
            }
          EXPECT_EQ(bad, 0) << bits << "-bit group " << group << " n " << n;
        }
}

TEST(CudaQuant, GemvFusionsMatchTheUnfusedMath) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  struct Shape {
    int64_t rows, cols;
  };
  // 2,048 columns: the words split over 2 (8-bit: 4) warps at batches 1-2.
  for (Shape s : {Shape{38, 384}, Shape{37, 384}, Shape{38, 2048}})
    for (int bits : {4, 8})
      for (int64_t n : {1, 2, 3, 9}) {
        // The sandwich-norm cases (pre_add) take any batch here: the
        // quantize kernel builds each row's h' before quantizing it.
        std::vector<HostFusion> cases = fusion_cases(s.rows, s.cols);
        for (HostFusion& f : pre_add_cases(s.rows, s.cols, n)) cases.push_back(std::move(f));
        for (const HostFusion& f : cases) {
          const int64_t rows = s.rows, cols = s.cols;
          RandomAffine w(bits, 64, rows, cols, uint32_t(bits * 100 + n + rows));
          std::vector<float> W;
          for (int64_t r = 0; r < rows; ++r) {
            const std::vector<float> wr = w.row(r);
            W.insert(W.end(), wr.begin(), wr.end());
          }
          const auto x = random_floats(size_t(n * cols), 31, 2.f);
          const auto base = random_floats(size_t(n * rows), 32);
          const int64_t outputs = f.gate != cuda::GemvGate::None ? rows / 2 : rows;
          auto dx = upload(x);
          DeviceFusion df(f);
          auto dy = upload(f.accumulate ? base : std::vector<float>(size_t(n * outputs), 0.f));
          cuda::gemv_affine(w.dev, dx.as<float>(), n, dy.as<float>(), nullptr, df.fusion);
          const std::string what = std::to_string(bits) + "-bit " + std::to_string(rows) +
                                   " rows n=" + std::to_string(n) + " " + f.name;
          expect_fused_gemv(download<float>(dy, size_t(n * outputs)), W, rows, cols, x, n, f, base,
                            what, /*int8_acts=*/true);
          if (!f.pre_add.empty())
            expect_residual_out(download<float>(df.residual_out, size_t(n * cols)), x, n, cols, f,
                                what);
        }
      }
  // Rows past the quantize kernel's registers are refused, not truncated.
  {
    RandomAffine w(4, 64, 8, 12800, 7);
    HostFusion f = pre_add_cases(8, 12800, 1).back();
    DeviceFusion df(f);
    auto dx = upload(random_floats(12800, 33, 1.f));
    cuda::DeviceBuffer dy(8 * sizeof(float));
    EXPECT_FALSE(cuda::gemv_affine_pre_add_fits(12800));
    EXPECT_THROW(cuda::gemv_affine(w.dev, dx.as<float>(), 1, dy.as<float>(), nullptr, df.fusion),
                 Error);
  }
}

// GemvFusion::quantized_out / quantized_in: the gated GEMV quantizes its
// outputs for the down projection in its epilogue, and the down GEMV reads
// them instead of quantizing its input. Against the unfused pair (the gated
// GEMV's f32 outputs, then the down GEMV quantizing them itself), which
// sums the same integer products in the same order per lane and quantizes
// the same f32 values: equal within 1e-6 of the output's scale. Batches 1
// and 2, both activations, 1-216 blocks of 32 outputs (6,912: gemma-3-1b's
// intermediate width), an input norm, bias, and the down's residual add;
// then the shapes and weights it refuses.
TEST(CudaQuant, GatedGemvQuantizesTheDownProjectionsInput) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  struct Shape {
    int64_t outputs, cols, down_rows;
  };
  for (Shape s : {Shape{32, 384, 37}, Shape{192, 1152, 64}, Shape{6912, 1152, 40}})
    for (int64_t n : {1, 2})
      for (cuda::GemvGate gate : {cuda::GemvGate::SiLU, cuda::GemvGate::GeluTanh})
        for (bool extras : {false, true}) {  // input norm, bias, residual add
          const std::string what = std::to_string(s.outputs) + " outputs n=" + std::to_string(n) +
                                   (gate == cuda::GemvGate::SiLU ? " silu" : " gelu") +
                                   (extras ? " +norm, bias, residual" : "");
          RandomAffine gu(4, 64, 2 * s.outputs, s.cols, uint32_t(s.outputs + n));
          // Groups of 32: the 32-column down matrix has no group of 64.
          RandomAffine down(4, 32, s.down_rows, s.outputs, uint32_t(s.cols + n));
          auto dx = upload(random_floats(size_t(n * s.cols), 41, 2.f));
          auto dbias = upload(random_floats(size_t(2 * s.outputs), 42, 0.5f));
          const auto base = random_floats(size_t(n * s.down_rows), 43);
          cuda::GemvFusion up;
          up.gate = gate;
          if (extras) {
            up.normalize = true;
            up.norm_eps = 1e-6f;
            up.bias = dbias.as<float>();
          }
          cuda::GemvFusion dn;
          dn.accumulate = extras;
          // Unfused: f32 outputs, then the down GEMV's own quantize kernel.
          cuda::DeviceBuffer g(size_t(n * s.outputs) * sizeof(float));
          auto ref = upload(base);
          cuda::gemv_affine(gu.dev, dx.as<float>(), n, g.as<float>(), nullptr, up);
          cuda::gemv_affine(down.dev, g.as<float>(), n, ref.as<float>(), nullptr, dn);
          // Fused.
          ASSERT_TRUE(cuda::gemv_affine_quantized_out_fits(gu.dev, n)) << what;
          cuda::DeviceBuffer q(cuda::gemv_affine_scratch_bytes(4, n, s.outputs));
          auto y = upload(base);
          up.quantized_out = q.as<uint8_t>();
          dn.quantized_in = q.as<uint8_t>();
          cuda::gemv_affine(gu.dev, dx.as<float>(), n, nullptr, nullptr, up);
          cuda::gemv_affine(down.dev, g.as<float>(), n, y.as<float>(), nullptr, dn);
          const auto want = download<float>(ref, size_t(n * s.down_rows));
          const auto got = download<float>(y, size_t(n * s.down_rows));
          float scale = 0.f, worst = 0.f;
          for (size_t i = 0; i < want.size(); ++i) {
            scale = std::max(scale, std::fabs(want[i]));
            worst = std::max(worst, std::fabs(got[i] - want[i]));
          }
          EXPECT_GT(scale, 0.f) << what;
          EXPECT_LE(worst, 1e-6f * scale) << what;
        }
  // Refused: 8-bit weights, 3 batch rows, outputs not a multiple of 32, a
  // plain GEMV, a norm over pre-quantized input, and the bf16 GEMV.
  RandomAffine g8(8, 64, 64, 384, 1), g4(4, 64, 64, 384, 2), odd(4, 64, 60, 384, 3);
  auto dx = upload(random_floats(3 * 384, 44, 1.f));
  cuda::DeviceBuffer q(cuda::gemv_affine_scratch_bytes(4, 3, 384)), y(3 * 384 * sizeof(float));
  cuda::GemvFusion f;
  f.gate = cuda::GemvGate::SiLU;
  f.quantized_out = q.as<uint8_t>();
  EXPECT_FALSE(cuda::gemv_affine_quantized_out_fits(g8.dev, 1));
  EXPECT_FALSE(cuda::gemv_affine_quantized_out_fits(g4.dev, 3));
  EXPECT_FALSE(cuda::gemv_affine_quantized_out_fits(odd.dev, 1));
  EXPECT_THROW(cuda::gemv_affine(g8.dev, dx.as<float>(), 1, y.as<float>(), nullptr, f), Error);
  EXPECT_THROW(cuda::gemv_affine(g4.dev, dx.as<float>(), 3, y.as<float>(), nullptr, f), Error);
  EXPECT_THROW(cuda::gemv_affine(odd.dev, dx.as<float>(), 1, y.as<float>(), nullptr, f), Error);
  f.gate = cuda::GemvGate::None;
  EXPECT_THROW(cuda::gemv_affine(g4.dev, dx.as<float>(), 1, y.as<float>(), nullptr, f), Error);
  cuda::GemvFusion in;
  in.quantized_in = q.as<uint8_t>();
  in.normalize = true;
  EXPECT_THROW(cuda::gemv_affine(g4.dev, dx.as<float>(), 1, y.as<float>(), nullptr, in), Error);
  cuda::DeviceBuffer w16(64 * 384 * 2);
  in.normalize = false;
  EXPECT_THROW(
      cuda::gemv_bf16(w16.as<uint16_t>(), 64, 384, dx.as<float>(), 1, y.as<float>(), nullptr, in),
      Error);
}

// The shapes above that split their words over warps (and 384 columns,
// which do not).
TEST(CudaQuant, GemvSplitsTheWordsOfShortMatrices) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  RandomAffine a(4, 64, 38, 2048, 1), b(8, 64, 37, 1152, 2), c(4, 64, 37, 384, 3);
  EXPECT_EQ(cuda::gemv_affine_split(a.dev, 1, false), 4);
  EXPECT_EQ(cuda::gemv_affine_split(a.dev, 2, true), 4);
  EXPECT_EQ(cuda::gemv_affine_split(b.dev, 1, false), 4);
  EXPECT_EQ(cuda::gemv_affine_split(c.dev, 1, false), 1);
  EXPECT_EQ(cuda::gemv_affine_split(a.dev, 3, false), 1);
}

// gemm_affine_int8 (int8 tensor cores, steps of up to 32 tokens) against
// the dequantized weights times the int8 activations, with the GEMV's
// bound: every token-tile count (1-16 and 17-32 tokens), groups of 32-128,
// a column share that does not divide evenly over the block's 8 warps
// (1,152 columns: 36 blocks of 32), rows whose scales a stage copies a
// float at a time and a last stage of 2 blocks (832 columns: 26 blocks),
// 4,096 columns (four stages a warp: its ring refilled), and each row
// tiling it picks (16 rows a warp at 37 rows; 32 and 64 where the rows
// give every SM a block of them).
TEST(CudaQuant, Int8MmaGemmMatchesTheDequantizedReference) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  struct Case {
    int64_t rows, cols;
    int group;
    int64_t n;
  };
  std::vector<Case> cases;
  for (int64_t cols : {384, 832, 1152})
    for (int group : {32, 64, 128})
      for (int64_t n : {1, 3, 9, 16, 17, 32})
        if (cols % group == 0) cases.push_back({37, cols, group, n});
  // Four stages a warp: around each ring of stages once or twice.
  for (int64_t n : {5, 16, 32}) cases.push_back({37, 4096, 64, n});
  for (int64_t rows : {int64_t(32) * sms + 5, int64_t(64) * sms + 3})
    for (int64_t n : {9, 16, 32}) cases.push_back({rows, 384, 64, n});
  for (const Case& k : cases) {
    const int64_t rows = k.rows, cols = k.cols, n = k.n;
    RandomAffine w(4, k.group, rows, cols, uint32_t(k.group + n + cols + rows));
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> x(size_t(n * cols));
    for (float& v : x) v = d(rng);
    std::vector<QuantizedRow> xq;
    for (int64_t t = 0; t < n; ++t)
      xq.push_back(
          quantize_row(std::vector<double>(x.begin() + t * cols, x.begin() + (t + 1) * cols)));
    auto dx = upload(x);
    std::vector<double> ref(size_t(n * rows)), mag(ref.size());
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> wr = w.row(r);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < cols; ++c) {
          const double p = double(wr[size_t(c)]) * xq[size_t(t)].value[size_t(c)];
          ref[size_t(t * rows + r)] += p;
          mag[size_t(t * rows + r)] += std::fabs(p);
        }
    }
    cuda::DeviceBuffer dy(size_t(n * rows) * 4);
    cuda::gemm_affine_int8(w.dev, dx.as<float>(), n, dy.as<float>(), nullptr);
    const auto got = download<float>(dy, size_t(n * rows));
    int bad = 0;
    for (size_t at = 0; at < got.size(); ++at)
      if (std::fabs(got[at] - ref[at]) > 1e-5 * mag[at] + 1e-6 && bad++ < 3)
        ADD_FAILURE() << rows << " x " << cols << " group " << k.group << " n " << n << " ["
                      << at / size_t(rows) << ", " << at % size_t(rows) << "] gpu " << got[at]
                      << " ref " << ref[at];
    EXPECT_EQ(bad, 0) << rows << " x " << cols << " group " << k.group << " n " << n;
  }
}

TEST(CudaQuant, DequantizeAndEmbedAreExact) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  for (int bits : {4, 8}) {
    const int64_t rows = 29, cols = 256;
    RandomAffine w(bits, 64, rows, cols, uint32_t(bits));
    const int64_t r0 = 5, m = 20;
    cuda::DeviceBuffer tile(size_t(m * cols) * 2), tile_lo(size_t(m * cols) * 2);
    cuda::dequantize_affine_bf16(w.dev, r0, m, tile.as<uint16_t>(), tile_lo.as<uint16_t>(),
                                 nullptr);
    const auto bf = download<uint16_t>(tile, size_t(m * cols));
    const auto bf_lo = download<uint16_t>(tile_lo, size_t(m * cols));
    for (int64_t i = 0; i < m; ++i) {
      const std::vector<float> wr = w.row(r0 + i);
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t hi = f32_to_bf16(wr[size_t(c)]);
        ASSERT_EQ(bf[size_t(i * cols + c)], hi) << bits << "-bit row " << r0 + i << " col " << c;
        ASSERT_EQ(bf_lo[size_t(i * cols + c)], f32_to_bf16(wr[size_t(c)] - bf16_to_f32(hi)))
            << bits << "-bit row " << r0 + i << " col " << c << " (lo part)";
      }
    }
    const std::vector<int32_t> ids = {3, 0, 28, 3};
    auto dids = upload(ids);
    cuda::DeviceBuffer out(ids.size() * size_t(cols) * 4);
    const float factor = 1.7f;
    cuda::embed_rows_affine(w.dev, dids.as<int32_t>(), int64_t(ids.size()), factor, out.as<float>(),
                            nullptr);
    const auto got = download<float>(out, ids.size() * size_t(cols));
    for (size_t t = 0; t < ids.size(); ++t) {
      const std::vector<float> wr = w.row(ids[t]);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(got[t * size_t(cols) + size_t(c)], wr[size_t(c)] * factor)
            << bits << "-bit token " << t << " col " << c;
    }
  }
}

TEST(CudaQuant, QuantizedModelsMatchTheCpuDecoder) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  const std::vector<int32_t> ids = {144, 31, 102, 78, 270, 261, 176, 226, 125, 65, 159, 141, 19};
  const int64_t n = int64_t(ids.size());
  setenv("TANDEM_CUDA_PACKED_QUANT", "1", 1);  // 8-bit matrices packed too
  for (const char* name : {"llama-f32", "qwen3-f32", "gemma4_text-f32", "ministral3-f32"}) {
    size_t bytes_at[9] = {};
    const bool gemma4 = std::string(name).rfind("gemma4", 0) == 0;
    for (int bits : {4, 8}) {
      LoadOptions o;
      o.quantize_bits = bits;
      o.quantize_group_size = 32;
      auto model = load_model(fixture(name), o);
      const int64_t V = model->spec.vocab;
      // The CPU decoder with int8 activations (its default, the GEMV
      // steps' oracle) and with exact f32 ones (the prefill steps').
      auto cpu_logits = [&](bool reference) {
        std::vector<float> out(size_t(n * V));
        cpu::set_quant_reference_for_testing(reference);
        ThreadPool pool(2);
        KvPool kv = single_sequence_pool(model->spec, n, Decoder::kDefaultStepTokens);
        Decoder ref(*model, pool, kv);
        SequenceKv s;
        run_sequence(ref, ids.data(), n, s, out.data(), true);
        cpu::set_quant_reference_for_testing(false);
        return out;
      };
      const std::vector<float> want_int8 = cpu_logits(false), want_f32 = cpu_logits(true);
      // Prefill-sized steps dequantize in tiles: the buffer's 32M weights
      // (one tile a fixture matrix), then tiles of 300 weights (a few rows);
      // with TANDEM_CUDA_AFFINE_MMA=1 (the default), 4-bit steps of 5 to 32
      // tokens take the int8 tensor-core GEMM (the GEMV's numerics) instead;
      // =0 keeps steps of up to affine_gemv_max_tokens() on the GEMV.
      struct Steps {
        int64_t tokens;
        const char* tile_weights;
        bool mma;
      };
      for (Steps st :
           {Steps{2, nullptr, false},
            Steps{cuda::Decoder::affine_gemv_max_tokens(), nullptr, false},
            Steps{256, nullptr, false}, Steps{256, "300", false}, Steps{8, nullptr, true},
            Steps{16, nullptr, true}, Steps{32, nullptr, true}}) {
        const int64_t step = st.tokens;
        const ScopedEnv tiles("TANDEM_CUDA_DEQUANT_TILE_WEIGHTS",
                              st.tile_weights ? st.tile_weights : "33554432");
        const ScopedEnv mma("TANDEM_CUDA_AFFINE_MMA", st.mma ? "1" : "0");
        KvPool kv = single_sequence_pool(model->spec, n, step, /*host_storage=*/false);
        cuda::Decoder gpu(*model, kv, step, 0, cuda::GemmInputs::HiLo);
        EXPECT_EQ(gpu.weight_bytes(), cuda::Decoder::weight_bytes_for(*model));
        bytes_at[bits] = gpu.weight_bytes();
        SequenceKv s;
        std::vector<float> got(size_t(n * V));
        run_sequence(gpu, ids.data(), n, s, got.data(), true);
        const bool gemv = step <= cuda::Decoder::affine_gemv_max_tokens() ||
                          (st.mma && bits == 4 && step <= cuda::kAffineMmaMaxTokens);
        const double err = relative_error(got, gemv ? want_int8 : want_f32);
        const double tolerance = gemv ? (gemma4 ? 0.3 : 1e-4) : gemma4 ? 2e-3 : 1e-3;
        EXPECT_LE(err, tolerance) << name << " " << bits << "-bit, steps of " << step
                                  << ", dequantized tiles of "
                                  << (st.tile_weights ? st.tile_weights : "32M");
        std::printf(
            "[cuda quant] %-16s %d-bit g32 steps of %3lld%s: max|gpu - cpu| = %.2e x std%s\n", name,
            bits, (long long)step,
            st.tile_weights ? " (300-weight tiles)"
            : st.mma        ? " (TANDEM_CUDA_AFFINE_MMA=1)"
                            : "",
            err, gemv ? " (int8 activations)" : "");
        if (gemv)
          std::printf("[cuda quant] %-16s   int8 activations moved the logits by %.2e x std\n",
                      name, relative_error(got, want_f32));
      }
    }
    EXPECT_LT(bytes_at[4], bytes_at[8]) << name << ": 4-bit weights should stay packed";
  }
  unsetenv("TANDEM_CUDA_PACKED_QUANT");
}

}  // namespace
