// Affine 4/8-bit weights on the GPU against the CPU's dequantization
// (core/quant.h dequantize_row, the reference):
//  - gemv_affine: |gpu - ref| ≤ 1e-5 · Σ|w·x| + 1e-6 (f32 sums in another
//    order), bits 4 and 8, groups 32/64/128, batches 1, 3 and 9, up to 8,192
//    columns (batch runs cut to what shared memory stages); and with
//    each fusion (input norm, bias, residual add, gated activation) against
//    the unfused math in double (gemv_reference.h states the bound);
//  - dequantize_affine_bf16 and embed_rows_affine: bit-exact;
//  - cuda::Decoder on on-load-quantized fixtures with
//    TANDEM_CUDA_PACKED_QUANT=1 (the matrices stay packed on the device:
//    4-bit weights take fewer bytes than 8-bit ones) against the
//    CPU decoder on the same quantized model with exact f32 activations
//    (its reference path): GEMV steps within 1e-4 × std; prefill steps
//    through bf16 hi + lo tiles of the dequantized weights (16 significant
//    bits; bf16 tiles alone were 0.5 × std off on Gemma 4) within 1e-3 ×
//    std, Gemma 4 2e-3 (measured 1.05e-3), as the bf16 fixtures' prefill
//    with the tensor-core attention (these random fixtures amplify rounding
//    more than real models do).
// Skipped, with the reason printed, where no CUDA device is usable.
#include <gtest/gtest.h>

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
  // Fewer 16-byte vectors than lanes; Gemma 3 1B's width; a down projection
  // wide enough that 9 batch rows' staged activations take two launches (6 + 3).
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
          cuda::DeviceBuffer dy(size_t(n * rows) * 4);
          cuda::gemv_affine(w.dev, dx.as<float>(), n, dy.as<float>(), nullptr);
          const auto got = download<float>(dy, size_t(n * rows));
          int bad = 0;
          for (int64_t r = 0; r < rows; ++r) {
            const std::vector<float> wr = w.row(r);
            for (int64_t t = 0; t < n; ++t) {
              double ref = 0, mag = 0;
              for (int64_t c = 0; c < cols; ++c) {
                ref += double(wr[size_t(c)]) * x[size_t(t * cols + c)];
                mag += std::fabs(double(wr[size_t(c)]) * x[size_t(t * cols + c)]);
              }
              const double g = got[size_t(t * rows + r)];
              if (std::fabs(g - ref) > 1e-5 * mag + 1e-6 && bad++ < 3)
                ADD_FAILURE() << bits << "-bit group " << group << " cols " << cols << " n " << n
                              << " [" << t << ", " << r << "] gpu " << g << " ref " << ref;
            }
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
      for (const HostFusion& f : fusion_cases(s.rows, s.cols))
        for (int64_t n : {1, 2, 3, 9}) {
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
          auto dy = upload(f.accumulate ? base : std::vector<float>(size_t(n * outputs), 0.f));
          DeviceFusion df(f);
          cuda::gemv_affine(w.dev, dx.as<float>(), n, dy.as<float>(), nullptr, df.fusion);
          expect_fused_gemv(download<float>(dy, size_t(n * outputs)), W, rows, cols, x, n, f, base,
                            std::to_string(bits) + "-bit " + std::to_string(rows) +
                                " rows n=" + std::to_string(n) + " " + f.name);
        }
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

TEST(CudaQuant, QuantizedModelsMatchTheCpuReferencePath) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  const std::vector<int32_t> ids = {144, 31, 102, 78, 270, 261, 176, 226, 125, 65, 159, 141, 19};
  const int64_t n = int64_t(ids.size());
  setenv("TANDEM_CUDA_PACKED_QUANT", "1", 1);  // the packed path (opt-in until it has run on a GPU)
  for (const char* name : {"llama-f32", "qwen3-f32", "gemma4_text-f32", "ministral3-f32"}) {
    size_t bytes_at[9] = {};
    for (int bits : {4, 8}) {
      LoadOptions o;
      o.quantize_bits = bits;
      o.quantize_group_size = 32;
      auto model = load_model(fixture(name), o);
      const int64_t V = model->spec.vocab;
      std::vector<float> want(size_t(n * V));
      {
        cpu::set_quant_reference_for_testing(true);
        ThreadPool pool(2);
        KvPool kv = single_sequence_pool(model->spec, n, Decoder::kDefaultStepTokens);
        Decoder ref(*model, pool, kv);
        SequenceKv s;
        run_sequence(ref, ids.data(), n, s, want.data(), true);
        cpu::set_quant_reference_for_testing(false);
      }
      for (int64_t step : {int64_t(2), cuda::Decoder::affine_gemv_max_tokens(), int64_t(256)}) {
        KvPool kv = single_sequence_pool(model->spec, n, step, /*host_storage=*/false);
        cuda::Decoder gpu(*model, kv, step, 0, cuda::GemmInputs::HiLo);
        EXPECT_EQ(gpu.weight_bytes(), cuda::Decoder::weight_bytes_for(*model));
        bytes_at[bits] = gpu.weight_bytes();
        SequenceKv s;
        std::vector<float> got(size_t(n * V));
        run_sequence(gpu, ids.data(), n, s, got.data(), true);
        const double err = relative_error(got, want);
        const bool gemv = step <= cuda::Decoder::affine_gemv_max_tokens();
        const double prefill_tolerance = std::string(name).rfind("gemma4", 0) == 0 ? 2e-3 : 1e-3;
        EXPECT_LE(err, gemv ? 1e-4 : prefill_tolerance)
            << name << " " << bits << "-bit, steps of " << step;
        std::printf("[cuda quant] %-16s %d-bit g32 steps of %3lld: max|gpu - cpu| = %.2e x std\n",
                    name, bits, (long long)step, err);
      }
    }
    EXPECT_LT(bytes_at[4], bytes_at[8]) << name << ": 4-bit weights should stay packed";
  }
  unsetenv("TANDEM_CUDA_PACKED_QUANT");
}

}  // namespace
