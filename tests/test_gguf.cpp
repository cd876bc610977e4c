// GGUF reading: metadata of every value type, tensor infos and alignment; the
// dequantization of each block type against hand-computed blocks; the
// lossless affine re-packing; every malformed-file error.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"
#include "gguf_writer.h"
#include "model/gguf.h"
#include "model/gguf_blocks.h"
#include "model/gguf_model.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;
using test::GgufWriter;

namespace {

void put_f16(std::vector<uint8_t>& b, float v) {
  const uint16_t h = f32_to_f16(v);
  b.push_back(uint8_t(h & 0xFF));
  b.push_back(uint8_t(h >> 8));
}

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  gguf_dequantize(t, b.data(), n, y.data());
  return y;
}

// ---- Block types against hand-computed values ------------------------------------

TEST(GgufBlocks, Q8_0) {
  std::vector<uint8_t> b;
  put_f16(b, 0.5f);
  for (int i = 0; i < 32; ++i) b.push_back(uint8_t(int8_t(i - 16)));
  const auto y = dequant(GgmlType::Q8_0, b, 32);
  EXPECT_EQ(y[0], -8.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 7.5f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[size_t(i)], 0.5f * float(i - 16)) << i;
}

TEST(GgufBlocks, Q4_0) {
  std::vector<uint8_t> b;
  put_f16(b, 2.0f);
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t(j | ((15 - j) << 4)));
  const auto y = dequant(GgmlType::Q4_0, b, 32);
  EXPECT_EQ(y[0], -16.0f);   // low nibble 0
  EXPECT_EQ(y[15], 14.0f);   // low nibble 15
  EXPECT_EQ(y[16], 14.0f);   // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -16.0f);  // high nibble of qs[15] = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[size_t(j)], 2.0f * float(j - 8));
    EXPECT_EQ(y[size_t(j + 16)], 2.0f * float(7 - j));
  }
}

// d = 1, dmin = 0.5; sub-block scales {1, 2, 3, 4, 33, 6, 7, 8} and mins
// {0, 1, 2, 3, 4, 5, 6, 40} (33 and 40 use the 2 high bits), packed by hand.
TEST(GgufBlocks, Q4_K) {
  const int sc[8] = {1, 2, 3, 4, 33, 6, 7, 8}, m[8] = {0, 1, 2, 3, 4, 5, 6, 40};
  std::vector<uint8_t> b;
  put_f16(b, 1.0f);
  put_f16(b, 0.5f);
  for (uint8_t s : {129, 2, 3, 4, 0, 1, 2, 131, 65, 86, 103, 136}) b.push_back(s);
  for (int k = 0; k < 128; ++k) b.push_back(uint8_t((k % 16) | ((15 - k % 16) << 4)));
  ASSERT_EQ(b.size(), 144u);
  const auto y = dequant(GgmlType::Q4_K, b, 256);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[5], 5.0f);
  EXPECT_EQ(y[40], 13.5f);   // sub-block 1, high nibble 7: 2·7 − 0.5·1
  EXPECT_EQ(y[130], 64.0f);  // sub-block 4: 33·2 − 0.5·4
  EXPECT_EQ(y[250], 20.0f);  // sub-block 7, high nibble 5: 8·5 − 0.5·40
  EXPECT_EQ(y[255], -20.0f);
  for (int i = 0; i < 256; ++i) {
    const int q = i % 64 < 32 ? i % 16 : 15 - i % 16;
    EXPECT_EQ(y[size_t(i)], float(sc[i / 32]) * float(q) - 0.5f * float(m[i / 32])) << i;
  }
}

// d = 0.25, scales ±(k+1), q = v mod 64 (6 bits: 4 in ql, 2 in qh).
// A Q6_K block with codes q[256] (0..63), sub-block scales sc[16] and d.
std::vector<uint8_t> q6k_block(const int* q, const int* sc, float d) {
  std::vector<uint8_t> b(210, 0);
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const int* h = q + 128 * n;
      b[size_t(64 * n + l)] = uint8_t((h[l] & 0xF) | ((h[l + 64] & 0xF) << 4));
      b[size_t(64 * n + l + 32)] = uint8_t((h[l + 32] & 0xF) | ((h[l + 96] & 0xF) << 4));
      b[size_t(128 + 32 * n + l)] = uint8_t((h[l] >> 4) | ((h[l + 32] >> 4) << 2) |
                                            ((h[l + 64] >> 4) << 4) | ((h[l + 96] >> 4) << 6));
    }
  for (int k = 0; k < 16; ++k) b[size_t(192 + k)] = uint8_t(int8_t(sc[k]));
  const uint16_t h = f32_to_f16(d);
  b[208] = uint8_t(h & 0xFF);
  b[209] = uint8_t(h >> 8);
  return b;
}

TEST(GgufBlocks, Q6_K) {
  int q[256];
  for (int v = 0; v < 256; ++v) q[v] = v % 64;
  int sc[16];
  for (int k = 0; k < 16; ++k) sc[k] = k % 2 ? -(k + 1) : k + 1;
  const std::vector<uint8_t> b = q6k_block(q, sc, 0.25f);
  const auto y = dequant(GgmlType::Q6_K, b, 256);
  EXPECT_EQ(y[0], -8.0f);      // 0.25 · 1 · (0 − 32)
  EXPECT_EQ(y[16], 8.0f);      // 0.25 · −2 · (16 − 32)
  EXPECT_EQ(y[100], 7.0f);     // 0.25 · 7 · (36 − 32)
  EXPECT_EQ(y[255], -124.0f);  // 0.25 · −16 · (63 − 32)
  for (int v = 0; v < 256; ++v)
    EXPECT_EQ(y[size_t(v)], 0.25f * float(sc[v / 16]) * float(q[v] - 32)) << v;
}

TEST(GgufBlocks, FloatTypes) {
  std::vector<uint8_t> b;
  put_f16(b, 1.5f);
  put_f16(b, -0.25f);
  EXPECT_EQ(dequant(GgmlType::F16, b, 2), (std::vector<float>{1.5f, -0.25f}));
  const uint16_t h[2] = {f32_to_bf16(3.0f), f32_to_bf16(-2.5f)};
  std::vector<uint8_t> bb(4);
  std::memcpy(bb.data(), h, 4);
  EXPECT_EQ(dequant(GgmlType::BF16, bb, 2), (std::vector<float>{3.0f, -2.5f}));
}

// Q8_0, Q4_0 and Q4_K in the affine storage dequantize to exactly the GGUF
// values; Q8_0 with scales whose bias overflows f16 falls back to F32 scales.
TEST(GgufBlocks, AffineIsLossless) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t rows = 3, cols = 512;
  std::vector<float> x(size_t(rows * cols));
  for (float& v : x) v = dist(rng);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K}) {
    for (float scale : {1.0f, 1e5f}) {  // 1e5: −128·d / −8·d overflow f16
      std::vector<float> xs = x;
      for (float& v : xs) v *= scale;
      const auto blocks = test::encode_rows(t, xs.data(), rows, cols);
      const auto want = dequant(t, blocks, rows * cols);
      OwnedBuffers owned;
      uint64_t bytes = 0;
      const WeightMatrix w = gguf_to_affine(t, blocks.data(), rows, cols, owned, bytes);
      EXPECT_NO_THROW(check_affine(w, "test"));
      EXPECT_EQ(w.bits, t == GgmlType::Q8_0 ? 8 : 4);
      const DType want_dtype = t == GgmlType::Q4_K || scale > 1 ? DType::F32 : DType::F16;
      EXPECT_EQ(w.dtype, want_dtype) << ggml_type_name(t) << " scale " << scale;
      EXPECT_EQ(test::matrix_values(w), want) << ggml_type_name(t) << " scale " << scale;
      // The encoders are sane: the values are near the input.
      double err = 0, norm = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        err += std::fabs(want[i] - xs[i]);
        norm += std::fabs(xs[i]);
      }
      EXPECT_LT(err / norm, t == GgmlType::Q8_0 ? 0.01 : 0.15) << ggml_type_name(t);
    }
  }
}

// Q6_K re-quantized to 8 bits in groups of 32: the sub-block with the larger
// |scale| of each group exact, the other within an eighth of that scale;
// equal |scales| of opposite signs whose codes reach both ends take the
// group's min/max grid, within (max - min) / 510.
TEST(GgufBlocks, Q6KRequantizedTo8BitsStaysWithinItsBound) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> code(0, 63), scale(-128, 127);
  const int64_t rows = 4, cols = 512;  // 8 blocks
  std::vector<uint8_t> blocks;
  std::vector<std::array<int, 16>> scs;
  for (int blk = 0; blk < rows * cols / 256; ++blk) {
    int q[256];
    std::array<int, 16> sc;
    for (int& v : q) v = code(rng);
    for (int& v : sc) v = scale(rng);
    if (blk == 0) {  // the fallback: ±s at both ends of the codes
      sc[0] = 40, sc[1] = -40;
      q[0] = 0, q[16] = 0;
    }
    if (blk == 1) sc[2] = sc[3] = 0;   // a group of zeros
    if (blk == 2) sc[4] = sc[5] = -7;  // equal scales: lossless
    const auto b = q6k_block(q, sc.data(), 0.01f * float(blk + 1));
    blocks.insert(blocks.end(), b.begin(), b.end());
    scs.push_back(sc);
  }
  const auto want = dequant(GgmlType::Q6_K, blocks, rows * cols);
  OwnedBuffers owned;
  uint64_t bytes = 0;
  const WeightMatrix w = gguf_q6k_to_affine(blocks.data(), rows, cols, owned, bytes);
  EXPECT_NO_THROW(check_affine(w, "test"));
  EXPECT_EQ(w.bits, 8);
  EXPECT_EQ(w.group_size, 32);
  EXPECT_EQ(bytes, uint64_t(rows * cols + rows * cols / 32 * 8));
  const std::vector<float> got = test::matrix_values(w);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int64_t blk = i / 256, g = i % 256 / 32, sub = i % 256 / 16;
    const float d = f16_to_f32(f32_to_f16(0.01f * float(blk + 1)));
    const int sa = scs[size_t(blk)][size_t(2 * g)], sb = scs[size_t(blk)][size_t(2 * g + 1)];
    const float m = d * float(std::max(std::abs(sa), std::abs(sb)));
    const bool larger =
        std::abs(scs[size_t(blk)][size_t(sub)]) == std::max(std::abs(sa), std::abs(sb));
    double bound = larger ? 1e-6 * (std::fabs(want[size_t(i)]) + m) : m / 8 * (1 + 1e-5);
    if (blk == 0 && g == 0) bound = 2 * 40 * 32 * d / 510 * (1 + 1e-5);
    ASSERT_LE(std::fabs(got[size_t(i)] - want[size_t(i)]), bound)
        << "value " << i << " (block " << blk << ", group " << g << ")";
  }
  EXPECT_THROW(gguf_q6k_to_affine(blocks.data(), 1, 128, owned, bytes), Error);
}

// ---- Reader ------------------------------------------------------------------------

TEST(GgufReader, MetadataOfEveryTypeAndAlignedTensors) {
  test::TempDir tmp;
  GgufWriter g;
  g.alignment = 64;
  g.u32("general.alignment", 64);
  g.str("general.architecture", "llama");
  g.raw("u8", 0, {200});
  g.raw("i8", 1, {0xFE});
  g.raw("u16", 2, {0x34, 0x12});
  g.raw("i16", 3, {0xFF, 0xFF});
  g.u32("u32", 4000000000u);
  g.i32("i32", -7);
  g.f32("f32", 1.5f);
  g.boolean("bool", true);
  g.raw("u64", 10, {1, 0, 0, 0, 0, 0, 0, 0x80});
  g.raw("i64", 11, {0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF});
  g.raw("f64", 12, {0, 0, 0, 0, 0, 0, 0x04, 0x40});  // 2.5
  g.str_array("strings", {"a", "", "c d"});
  g.i32_array("ints", {1, -2, 3});
  g.bool_array("bools", {true, false});
  std::vector<float> v = {1, 2, 3, 4, 5};
  g.tensor("vec", GgmlType::F32, {5}, test::encode_rows(GgmlType::F32, v.data(), 1, 5));
  std::vector<float> m(64 * 2, 0.5f);
  g.tensor("mat", GgmlType::Q8_0, {64, 2}, test::encode_rows(GgmlType::Q8_0, m.data(), 2, 64));
  const std::string path = tmp.path() + "/m.gguf";
  g.write(path);

  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->get_int("u8", 0), 200);
  EXPECT_EQ(f->get_int("i8", 0), -2);
  EXPECT_EQ(f->get_int("u16", 0), 0x1234);
  EXPECT_EQ(f->get_int("i16", 0), -1);
  EXPECT_EQ(f->get_int("u32", 0), 4000000000LL);
  EXPECT_EQ(f->get_int("i32", 0), -7);
  EXPECT_EQ(f->get_number("f32", 0), 1.5);
  EXPECT_EQ(f->find("bool")->as_int(), 1);
  EXPECT_EQ(f->get_number("u64", 0), 9223372036854775809.0);  // above INT64_MAX: kept unsigned
  EXPECT_EQ(f->get_int("i64", 0), -2);
  EXPECT_EQ(f->get_number("f64", 0), 2.5);
  const auto& strings = f->find("strings")->as_array();
  ASSERT_EQ(strings.size(), 3u);
  EXPECT_EQ(strings[2].as_string(), "c d");
  EXPECT_EQ(f->find("ints")->as_array()[1].as_int(), -2);
  EXPECT_EQ(f->find("bools")->as_array()[1].as_int(), 0);
  EXPECT_EQ(f->get_string("general.architecture", ""), "llama");
  EXPECT_NE(error_of([&] { f->get_int("general.architecture", 0); }).find("must be an integer"),
            std::string::npos);

  const GgufTensor* t = f->tensor("vec");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<int64_t>{5}));
  EXPECT_EQ(std::memcmp(f->data(*t), v.data(), 20), 0);
  EXPECT_EQ(uintptr_t(f->data(*t)) % 64, 0u);  // the data section is aligned in the file
  const GgufTensor* q = f->tensor("mat");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->cols(), 64);
  EXPECT_EQ(q->rows(), 2);
  EXPECT_EQ(q->offset % 64, 0u);
  EXPECT_EQ(q->bytes, 2u * 2u * 34u);
  std::vector<float> back(128);
  gguf_dequantize(q->type, f->data(*q), 128, back.data());
  EXPECT_NEAR(back[127], 0.5f, 1e-3);
}

TEST(GgufReader, FindsTheOneGgufOfAFolder) {
  test::TempDir tmp;
  EXPECT_EQ(find_gguf_model(tmp.path()), "");
  GgufWriter().write(tmp.path() + "/a.gguf");
  GgufWriter().write(tmp.path() + "/mmproj-a.gguf");  // a vision tower is not the model
  EXPECT_EQ(find_gguf_model(tmp.path()), tmp.path() + "/a.gguf");
  EXPECT_EQ(find_gguf_model(tmp.path() + "/a.gguf"), tmp.path() + "/a.gguf");
  GgufWriter().write(tmp.path() + "/b.gguf");
  EXPECT_NE(error_of([&] { find_gguf_model(tmp.path()); }).find("holds 2 GGUF files"),
            std::string::npos);
}

// ---- Malformed files -------------------------------------------------------------

class GgufMalformed : public ::testing::Test {
 protected:
  // A valid file: metadata and one Q8_0 tensor.
  GgufWriter valid() const {
    GgufWriter g;
    g.str("general.architecture", "llama");
    g.str_array("tokenizer.ggml.tokens", {"a", "b"});
    std::vector<float> m(64, 1.0f);
    g.tensor("w", GgmlType::Q8_0, {32, 2}, test::encode_rows(GgmlType::Q8_0, m.data(), 2, 32));
    return g;
  }
  // The error opening `bytes` as a file.
  std::string open_error(const std::vector<uint8_t>& bytes) {
    const std::string path = tmp_.path() + "/bad.gguf";
    test::write_file(path, bytes);
    const std::string e = error_of([&] { GgufFile::open(path); });
    EXPECT_NE(e.find(path), std::string::npos) << "the error names the file: " << e;
    return e;
  }
  test::TempDir tmp_;
};

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST_F(GgufMalformed, ValidBaselineOpens) {
  const std::string path = tmp_.path() + "/ok.gguf";
  valid().write(path);
  EXPECT_NO_THROW(GgufFile::open(path));
}

TEST_F(GgufMalformed, BadMagic) {
  auto b = valid().bytes();
  b[0] = 'X';
  EXPECT_HAS(open_error(b), "not a GGUF file: magic");
  EXPECT_HAS(open_error({1, 2, 3}), "shorter than the 24-byte header");
}

TEST_F(GgufMalformed, UnsupportedVersion) {
  GgufWriter g = valid();
  g.version = 2;
  EXPECT_HAS(open_error(g.bytes()), "GGUF version 2 is not supported (only version 3)");
}

TEST_F(GgufMalformed, TruncatedMetadata) {
  auto b = valid().bytes();
  b.resize(60);  // inside the first value (the counts still fit)
  EXPECT_HAS(open_error(b), "truncated GGUF file");
}

TEST_F(GgufMalformed, TruncatedTensorData) {
  auto b = valid().bytes();
  b.resize(b.size() - 10);
  const std::string e = open_error(b);
  EXPECT_HAS(e, "tensor \"w\"");
  EXPECT_HAS(e, "runs past the end of the file");
}

TEST_F(GgufMalformed, UnknownTensorType) {
  GgufWriter g;
  g.tensor_code("w", 3, {32}, std::vector<uint8_t>(20));  // Q4_1
  EXPECT_HAS(open_error(g.bytes()), "tensor type Q4_1 (3) is not supported");
  GgufWriter h;
  h.tensor_code("w", 999, {32}, std::vector<uint8_t>(20));
  EXPECT_HAS(open_error(h.bytes()), "tensor type code 999 is not supported");
}

TEST_F(GgufMalformed, PartialBlocks) {
  GgufWriter g;
  g.tensor("w", GgmlType::Q4_K, {128}, std::vector<uint8_t>(72));
  EXPECT_HAS(open_error(g.bytes()), "row length 128 is not a multiple of the Q4_K block size 256");
}

TEST_F(GgufMalformed, AbsurdCounts) {
  auto b = valid().bytes();
  const uint64_t huge = uint64_t(1) << 40;
  auto t = b;
  std::memcpy(t.data() + 8, &huge, 8);
  EXPECT_HAS(open_error(t), "tensor count 1099511627776 cannot fit");
  auto k = b;
  std::memcpy(k.data() + 16, &huge, 8);
  EXPECT_HAS(open_error(k), "metadata count 1099511627776 cannot fit");
  GgufWriter g;
  std::vector<uint8_t> arr = {8, 0, 0, 0};  // array of strings, 2^40 of them
  for (int i = 0; i < 8; ++i) arr.push_back(uint8_t(huge >> (8 * i)));
  g.raw("tokenizer.ggml.tokens", 9, arr);
  EXPECT_HAS(open_error(g.bytes()), "array of 1099511627776 string values cannot fit");
  GgufWriter d;
  d.tensor("w", GgmlType::F32, {int64_t(1) << 40, int64_t(1) << 40}, {});
  EXPECT_HAS(open_error(d.bytes()), "absurd dimensions");
}

TEST_F(GgufMalformed, BadValues) {
  GgufWriter g;
  g.raw("x", 77, {0});
  EXPECT_HAS(open_error(g.bytes()), "metadata \"x\": unknown value type 77");
  GgufWriter a;
  a.u32("general.alignment", 3);
  EXPECT_HAS(open_error(a.bytes()), "general.alignment must be a power of two");
  GgufWriter dup;
  dup.u32("k", 1);
  dup.u32("k", 2);
  EXPECT_HAS(open_error(dup.bytes()), "metadata key \"k\" appears twice");
}

TEST_F(GgufMalformed, ModelLevelErrors) {
  const std::string path = tmp_.path() + "/m.gguf";
  GgufWriter g = valid();
  g.write(path);
  // "llama" without its hyperparameters.
  EXPECT_HAS(error_of([&] { load_gguf_model(path); }), "token_embd.weight");
  GgufWriter p;
  p.str("general.architecture", "phi3");
  p.write(path);
  const std::string e = error_of([&] { load_gguf_model(path); });
  EXPECT_HAS(e, "GGUF architecture \"phi3\" is not supported");
  EXPECT_HAS(e, path);
}

}  // namespace
