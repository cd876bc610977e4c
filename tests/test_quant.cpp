// Quantized formats and kernels: hand-computed blocks for every storage kind
// (MLX affine 4/8-bit, FP8 e4m3), MLX's quantization rule, and the quantized
// matmul on every ISA path against a double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "test_util.h"

using namespace tandem;

namespace {

// An affine-quantized matrix with its storage.
struct QuantMatrix {
  std::vector<uint32_t> codes;
  std::vector<uint8_t> scales, biases;
  WeightMatrix w;
};

QuantMatrix quantize(const std::vector<float>& values, int64_t rows, int64_t cols, int bits,
                     int group, DType sd) {
  QuantMatrix q;
  const int64_t words = cols * bits / 32, groups = cols / group;
  q.codes.resize(size_t(rows * words));
  q.scales.resize(size_t(rows * groups) * dtype_size(sd));
  q.biases.resize(q.scales.size());
  for (int64_t r = 0; r < rows; ++r)
    affine_quantize_row(values.data() + r * cols, cols, bits, group, sd, q.codes.data() + r * words,
                        q.scales.data() + r * groups * dtype_size(sd),
                        q.biases.data() + r * groups * dtype_size(sd));
  q.w.dtype = sd;
  q.w.data = q.codes.data();
  q.w.rows = rows;
  q.w.cols = cols;
  q.w.format = WeightFormat::Affine;
  q.w.bits = bits;
  q.w.group_size = group;
  q.w.scales = q.scales.data();
  q.w.biases = q.biases.data();
  return q;
}

struct IsaGuard {
  ~IsaGuard() {
    cpu::set_isa_for_testing("");
    cpu::set_vnni_for_testing(true);
  }
};

// ---- Hand-computed blocks ------------------------------------------------------

TEST(QuantFormats, Affine4BitBlockDequantizes) {
  // One row of 32 values, group 32: value i has code (i % 16), packed 8 per
  // word, value 0 in the lowest nibble.
  std::vector<uint32_t> words(4);
  for (int i = 0; i < 32; ++i) words[size_t(i / 8)] |= uint32_t(i % 16) << (4 * (i % 8));
  EXPECT_EQ(words[0], 0x76543210u);
  EXPECT_EQ(words[1], 0xfedcba98u);
  const float scale = 0.5f, bias = -3.0f;
  WeightMatrix w;
  w.format = WeightFormat::Affine;
  w.dtype = DType::F32;
  w.data = words.data();
  w.rows = 1;
  w.cols = 32;
  w.bits = 4;
  w.group_size = 32;
  w.scales = &scale;
  w.biases = &bias;
  std::vector<float> row(32);
  dequantize_row(w, 0, row.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(row[size_t(i)], 0.5f * float(i % 16) - 3.0f) << i;
  EXPECT_EQ(w.nbytes(), 16u + 8u);
}

TEST(QuantFormats, Affine8BitBlockDequantizesPerGroup) {
  // Two rows of 64 values, group 32, bf16 scales: 4 values per word.
  std::vector<uint32_t> words(2 * 16);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 64; ++i)
      words[size_t(r * 16 + i / 4)] |= uint32_t((i * 3 + r) & 255) << (8 * (i % 4));
  EXPECT_EQ(words[0], 0x09060300u);  // codes 0, 3, 6, 9
  const uint16_t scales[4] = {f32_to_bf16(0.25f), f32_to_bf16(-2.0f), f32_to_bf16(1.0f),
                              f32_to_bf16(0.125f)};
  const uint16_t biases[4] = {f32_to_bf16(1.0f), f32_to_bf16(0.0f), f32_to_bf16(-1.5f),
                              f32_to_bf16(4.0f)};
  WeightMatrix w;
  w.format = WeightFormat::Affine;
  w.dtype = DType::BF16;
  w.data = words.data();
  w.rows = 2;
  w.cols = 64;
  w.bits = 8;
  w.group_size = 32;
  w.scales = scales;
  w.biases = biases;
  std::vector<float> row(64);
  for (int r = 0; r < 2; ++r) {
    dequantize_row(w, r, row.data());
    for (int i = 0; i < 64; ++i) {
      const int g = r * 2 + i / 32;
      EXPECT_EQ(row[size_t(i)],
                bf16_to_f32(scales[g]) * float((i * 3 + r) & 255) + bf16_to_f32(biases[g]))
          << r << "," << i;
    }
  }
}

TEST(QuantFormats, Fp8E4m3DecodesEveryClass) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);                  // exp 7, man 0
  EXPECT_EQ(fp8_e4m3_to_f32(0x40), 2.0f);                  // exp 8
  EXPECT_EQ(fp8_e4m3_to_f32(0x3c), 1.5f);                  // man 4
  EXPECT_EQ(fp8_e4m3_to_f32(0xb9), -1.125f);               // sign, man 1
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);                // the largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);  // exp 15 is finite in e4m3fn
}

// ---- MLX's quantization rule ----------------------------------------------------

TEST(QuantFormats, AffineQuantizationFollowsMlx) {
  // |min| > |max|: the scale is positive, the bias is the min (exact).
  {
    std::vector<float> g(32, 0.0f);
    g[0] = -3.0f;
    g[1] = 1.5f;
    g[2] = 0.7f;
    uint32_t codes[4];
    float s, b;
    affine_quantize_row(g.data(), 32, 4, 32, DType::F32, codes, &s, &b);
    // scale = 4.5/15 = 0.3; q0 = round(-3/0.3) = -10 -> scale = 0.3, bias = -3.
    EXPECT_NEAR(s, 0.3f, 1e-7f);
    EXPECT_EQ(b, -3.0f);
    EXPECT_EQ(affine_code(codes, 4, 0), 0u);
    EXPECT_EQ(affine_code(codes, 4, 1), 15u);
    EXPECT_EQ(affine_code(codes, 4, 3), 10u);  // 0 is exact at q = -q0
    EXPECT_EQ(s * 10.0f + b, 0.0f);
  }
  // |max| >= |min|: the scale is negative and the bias is the max.
  {
    std::vector<float> g(64);
    for (int i = 0; i < 64; ++i) g[size_t(i)] = 0.1f * float(i) - 1.0f;  // [-1, 5.3]
    uint32_t codes[16];
    float s, b;
    affine_quantize_row(g.data(), 64, 8, 64, DType::F32, codes, &s, &b);
    EXPECT_LT(s, 0.0f);
    EXPECT_EQ(b, g[63]);
    EXPECT_EQ(affine_code(codes, 8, 63), 0u);
    for (int i = 0; i < 64; ++i) {
      const float v = s * float(affine_code(codes, 8, i)) + b;
      // Rescaling the step so that 0 is exact can push the far extreme one
      // step past the last code, where it is clipped: at most one step off.
      EXPECT_LE(std::fabs(v - g[size_t(i)]), std::fabs(s) * 1.0001f) << i;
    }
  }
  // bf16 weights: MLX computes in bf16, each step rounded. {-1, 2, 0.5, 0…}:
  // scale = -bf16(3/15) = -0.2001953125; q0 = round(bf16(2 / scale)) =
  // round(-10.0) -> scale = bf16(2 / -10) = -0.2001953125, bias = 2;
  // 0.5: bf16(-1.5 / scale) = bf16(7.4927) = 7.5 -> round-half-even 8 (f32
  // arithmetic would give 7); -1: bf16(-3 / scale) = 15.
  {
    std::vector<float> g(32, 0.0f);
    g[0] = -1.0f;
    g[1] = 2.0f;
    g[2] = 0.5f;
    uint32_t codes[4];
    uint16_t s, b;
    affine_quantize_row(g.data(), 32, 4, 32, DType::BF16, codes, &s, &b);
    EXPECT_EQ(bf16_to_f32(s), -0.2001953125f);
    EXPECT_EQ(bf16_to_f32(b), 2.0f);
    EXPECT_EQ(affine_code(codes, 4, 0), 15u);
    EXPECT_EQ(affine_code(codes, 4, 1), 0u);
    EXPECT_EQ(affine_code(codes, 4, 2), 8u);
    EXPECT_EQ(affine_code(codes, 4, 3), 10u);  // 0 at -q0
  }
  // An all-zero group: bias 0, every code 0 — dequantizes to exactly 0.
  {
    std::vector<float> g(32, 0.0f), out(32);
    uint32_t codes[4];
    uint16_t s, b;
    affine_quantize_row(g.data(), 32, 4, 32, DType::BF16, codes, &s, &b);
    EXPECT_EQ(bf16_to_f32(b), 0.0f);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(affine_code(codes, 4, i), 0u);
  }
  // A constant group is exact.
  {
    std::vector<float> g(32, 0.75f);
    uint32_t codes[4];
    float s, b;
    affine_quantize_row(g.data(), 32, 4, 32, DType::F32, codes, &s, &b);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(s * float(affine_code(codes, 4, i)) + b, 0.75f);
  }
}

TEST(QuantFormats, AffineRoundTripErrorIsAtMostOneStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType sd : {DType::F32, DType::BF16, DType::F16}) {
        const int64_t rows = 3, cols = 256;
        std::vector<float> v(static_cast<size_t>(rows * cols)), out(static_cast<size_t>(cols));
        for (float& x : v) x = dist(rng);
        QuantMatrix q = quantize(v, rows, cols, bits, group, sd);
        for (int64_t r = 0; r < rows; ++r) {
          dequantize_row(q.w, r, out.data());
          for (int64_t g = 0; g < cols / group; ++g) {
            const float s = load_as_f32(q.scales.data(), sd, r * (cols / group) + g);
            for (int64_t i = g * group; i < (g + 1) * group; ++i)
              // One step (the far extreme may be clipped, see above), plus what
              // rounding the scale and bias to sd moves.
              EXPECT_LE(std::fabs(out[size_t(i)] - v[size_t(r * cols + i)]),
                        std::fabs(s) * 1.0001f + (sd == DType::F32 ? 1e-6f : 0.03f))
                  << bits << " bits, group " << group << ", " << dtype_name(sd) << ", row " << r
                  << ", col " << i;
          }
        }
      }
}

TEST(QuantFormats, MalformedAffineMatricesAreRejected) {
  WeightMatrix w;
  w.format = WeightFormat::Affine;
  w.dtype = DType::BF16;
  w.rows = 4;
  w.cols = 64;
  w.bits = 3;
  w.group_size = 64;
  auto message = [&] {
    try {
      check_affine(w, "tensor \"x\"");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message().find("3-bit"), std::string::npos) << message();
  w.bits = 4;
  w.group_size = 16;
  EXPECT_NE(message().find("group size 16"), std::string::npos) << message();
  w.group_size = 128;
  EXPECT_NE(message().find("does not divide"), std::string::npos) << message();
  w.group_size = 32;
  w.dtype = DType::I32;
  EXPECT_NE(message().find("I32"), std::string::npos) << message();
  w.dtype = DType::F16;
  EXPECT_EQ(message(), "");
}

// ---- Kernels ----------------------------------------------------------------------

// y = x · dequant(W)ᵀ in double, and the bound of the activation rounding:
// each x is off by at most half its block's step d = max|x| / 127.
void reference(const std::vector<float>& x, int64_t n, const WeightMatrix& w,
               const std::vector<float>& bias, std::vector<double>& y, std::vector<double>& bound) {
  std::vector<float> row(size_t(w.cols));
  y.assign(size_t(n * w.rows), 0.0);
  bound.assign(size_t(n * w.rows), 0.0);
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double s = bias.empty() ? 0.0 : bias[size_t(r)], b = 0.0, mag = 0.0;
      for (int64_t blk = 0; blk < w.cols / 32; ++blk) {
        double amax = 0.0;
        for (int64_t i = blk * 32; i < blk * 32 + 32; ++i)
          amax = std::max(amax, double(std::fabs(x[size_t(t * w.cols + i)])));
        for (int64_t i = blk * 32; i < blk * 32 + 32; ++i) {
          const double xv = x[size_t(t * w.cols + i)], wv = row[size_t(i)];
          s += xv * wv;
          b += std::fabs(wv) * amax / 127.0 * 0.5;
          mag += std::fabs(xv * wv);
        }
      }
      y[size_t(t * w.rows + r)] = s;
      bound[size_t(t * w.rows + r)] = b * 1.001 + 1e-5 * mag + 1e-6;
    }
  }
}

struct KernelCase {
  int bits, group;
  DType sd;
  int64_t rows, cols, n;
};

TEST(QuantKernels, EveryIsaMatchesTheReference) {
  IsaGuard guard;
  ThreadPool pool(2);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<KernelCase> cases;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType sd : {DType::BF16, DType::F16, DType::F32}) {
        // Row lengths that end mid-chunk for each ISA (96 = 3 x 32, 192, 320).
        for (int64_t cols : {int64_t(group), int64_t(group) * 3, int64_t(group) * 5, int64_t(1024)})
          for (int64_t n : {1, 3, 17}) cases.push_back({bits, group, sd, 37, cols, n});
      }
  cases.push_back({4, 64, DType::BF16, 300, 1152, 70});  // prefill, several token blocks
  cases.push_back({8, 32, DType::BF16, 7, 2048, 130});   // few rows, many activations
  for (const KernelCase& c : cases) {
    std::vector<float> wv(size_t(c.rows * c.cols)), x(size_t(c.n * c.cols)), bias(size_t(c.rows));
    for (float& v : wv) v = dist(rng) * 0.05f;
    for (float& v : x) v = dist(rng);
    for (float& v : bias) v = dist(rng);
    x[0] = 40.0f;  // an outlier in the first block
    QuantMatrix q = quantize(wv, c.rows, c.cols, c.bits, c.group, c.sd);
    std::vector<double> ref, bound;
    reference(x, c.n, q.w, bias, ref, bound);
    std::vector<float> scalar_y;
    for (const std::string& isa : test::supported_isas())
      for (bool vnni : {true, false}) {
        if (isa == "scalar" && !vnni) continue;
        ASSERT_TRUE(cpu::set_isa_for_testing(isa));
        cpu::set_vnni_for_testing(vnni);
        const std::string name = std::string(cpu::active_quant_isa());
        std::vector<float> y(size_t(c.n * c.rows), NAN);
        cpu::matmul(pool, x.data(), c.n, q.w, bias.data(), y.data());
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_LE(std::fabs(double(y[i]) - ref[i]), bound[i])
              << name << ": " << c.bits << " bits, group " << c.group << ", " << dtype_name(c.sd)
              << ", " << c.rows << "x" << c.cols << ", n " << c.n << ", index " << i << ": " << y[i]
              << " vs " << ref[i];
        // Every ISA computes the same integer sums: only the f32 summation
        // order differs from the scalar reference.
        if (isa == "scalar") {
          scalar_y = y;
        } else {
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_NEAR(y[i], scalar_y[i], 2e-5 * (1.0 + std::fabs(scalar_y[i])))
                << name << " vs scalar: " << c.bits << " bits, group " << c.group << ", " << c.rows
                << "x" << c.cols << ", n " << c.n << ", index " << i;
        }
      }
  }
}

TEST(QuantKernels, ZeroActivationsGiveTheBias) {
  ThreadPool pool(1);
  std::vector<float> wv(64 * 128, 0.3f), x(128, 0.0f), bias(64, 2.5f), y(64);
  QuantMatrix q = quantize(wv, 64, 128, 4, 64, DType::BF16);
  cpu::matmul(pool, x.data(), 1, q.w, bias.data(), y.data());
  for (float v : y) EXPECT_EQ(v, 2.5f);
}

}  // namespace
