// Dispatch, the multi-threaded matmul driver, and the portable scalar kernels
// (the reference the SIMD paths are tested against, and the fallback for
// processors without AVX2).
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/kernels_impl.h"
#include "backend/cpu/kernels_quant.h"
#include "core/error.h"
#include "core/quant.h"

namespace tandem::cpu {
namespace detail {
namespace {

// ---- Scalar reference kernels ---------------------------------------------

// Converts row r of W to f32.
void load_row(const WeightMatrix& w, int64_t r, float* dst) {
  convert_to_f32(static_cast<const char*>(w.data) + size_t(r * w.cols) * dtype_size(w.dtype),
                 w.dtype, w.cols, dst);
}

float dot_scalar(const float* a, const float* b, int64_t n) {
  // Four partial sums: the same association as a short SIMD vector, and it
  // lets the compiler overlap the adds.
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// One f32 copy of a weight row per thread, reused across calls.
std::vector<float>& row_buffer(int64_t cols) {
  thread_local std::vector<float> buf;
  if (int64_t(buf.size()) < cols) buf.resize(size_t(cols));
  return buf;
}

void stream_scalar(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                   int64_t r0, int64_t r1) {
  float* row = row_buffer(w.cols).data();
  for (int64_t r = r0; r < r1; ++r) {
    load_row(w, r, row);
    const float b = bias ? bias[r] : 0.0f;
    for (int64_t t = 0; t < n; ++t) y[t * w.rows + r] = dot_scalar(x + t * w.cols, row, w.cols) + b;
  }
}

void scores_scalar(const float* q, int nq, int64_t q_stride, const float* k, int64_t k_stride,
                   int64_t nk, int64_t dim, float scale, float* s, int64_t s_stride) {
  for (int g = 0; g < nq; ++g)
    for (int64_t j = 0; j < nk; ++j)
      s[g * s_stride + j] = dot_scalar(q + g * q_stride, k + j * k_stride, dim) * scale;
}

void values_scalar(const float* p, int nq, int64_t p_stride, const float* v, int64_t v_stride,
                   int64_t nk, int64_t dim, float* out, int64_t out_stride) {
  for (int g = 0; g < nq; ++g)
    for (int64_t j = 0; j < nk; ++j)
      axpy_scalar(p[g * p_stride + j], v + j * v_stride, out + g * out_stride, dim);
}

float exp_sum_scalar(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

}  // namespace

const AttentionKernels kScalarAttention = {scores_scalar, values_scalar, exp_sum_scalar, nullptr};

// Scalar code has no cache blocking to gain from: one kernel serves both.
const IsaKernels kScalarKernels = {"scalar", stream_scalar, stream_scalar, dot_scalar, axpy_scalar};

}  // namespace detail

// ---- Dispatch ---------------------------------------------------------------

namespace {

using detail::IsaKernels;

enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512"};

bool parse_isa(std::string_view s, Isa* out) {
  for (int i = 0; i < 3; ++i)
    if (s == kIsaNames[i]) {
      *out = Isa(i);
      return true;
    }
  return false;
}

// The widest ISA this processor and OS support (libgcc's cpuid probe also
// checks that the OS saves the wide registers).
Isa hardware_isa() {
  static const Isa isa = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return kAvx512;
    if (avx2) return kAvx2;
#endif
    return kScalar;
  }();
  return isa;
}

// The hardware ISA, narrowed by TANDEM_ISA (read once, at the first call).
Isa default_isa() {
  static const Isa isa = [] {
    Isa hw = hardware_isa();
    const char* env = std::getenv("TANDEM_ISA");
    if (!env || !*env) return hw;
    Isa want;
    if (!parse_isa(env, &want)) {
      std::fprintf(stderr, "tandem: ignoring TANDEM_ISA=%s (expected avx512, avx2 or scalar)\n",
                   env);
      return hw;
    }
    return std::min(want, hw);
  }();
  return isa;
}

std::atomic<int> g_forced_isa{-1};  // set_isa_for_testing; -1 = not forced

Isa current_isa() {
  const int forced = g_forced_isa.load(std::memory_order_relaxed);
  return forced >= 0 ? Isa(forced) : default_isa();
}

const IsaKernels& kernels() {
  switch (current_isa()) {
    case kAvx512: return detail::kAvx512Kernels;
    case kAvx2: return detail::kAvx2Kernels;
    default: return detail::kScalarKernels;
  }
}

// Whether the processor has the VNNI int8 dot products the quantized kernels
// use (AVX-512 VNNI, AVX-VNNI).
bool hardware_vnni(bool avx512) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return avx512 ? __builtin_cpu_supports("avx512vnni") : __builtin_cpu_supports("avxvnni");
#else
  return false;
#endif
}

// Whether the processor has AVX-512 BF16 (vdpbf16ps, vcvtneps2bf16).
bool hardware_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

std::atomic<bool> g_bf16_dot_allowed{true};  // set_bf16_dot_for_testing
std::atomic<bool> g_vnni_allowed{true};      // set_vnni_for_testing
std::atomic<bool> g_quant_reference{false};  // set_quant_reference_for_testing

// Quantized W against exact f32 activations: each row dequantized, f32 dot
// products (the scalar kernel's association). Slow; tests only.
void quant_reference(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w,
                     const float* bias, float* y) {
  pool.parallel_for(w.rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(w, r, row.data());
      for (int64_t t = 0; t < n; ++t)
        y[t * w.rows + r] = detail::kScalarKernels.dot(x + t * w.cols, row.data(), w.cols) +
                            (bias ? bias[r] : 0.0f);
    }
  });
}

// Quantized kernels of the current ISA: VNNI where present, else vpmaddubsw
// (an AVX-512 processor without VNNI uses the 256-bit kernels).
const detail::QuantKernels& quant_kernels() {
  static const bool avx512_vnni = hardware_vnni(true), avx_vnni = hardware_vnni(false);
  const bool vnni = g_vnni_allowed.load(std::memory_order_relaxed);
  switch (current_isa()) {
    case kAvx512:
      if (vnni && avx512_vnni) return detail::kAvx512VnniQuant;
      [[fallthrough]];
    case kAvx2: return vnni && avx_vnni ? detail::kAvxVnniQuant : detail::kAvx2Quant;
    default: return detail::kScalarQuant;
  }
}

// Below this many multiply-adds a chunk is not worth a dispatch (~1-2 us).
constexpr int64_t kMinChunkMacs = 64 * 1024;
// Output rows per scheduling unit: chunk boundaries fall on 64-byte lines of y
// and on the kernels' 4-row blocks.
constexpr int64_t kRowGroup = 16;
// Activation rows per scheduling unit when prefill splits over tokens.
constexpr int64_t kTokenGroup = 8;

}  // namespace

std::string_view active_isa() {
  return kIsaNames[current_isa()];
}

std::string_view active_quant_isa() {
  return quant_kernels().name;
}

void set_vnni_for_testing(bool allowed) {
  g_vnni_allowed.store(allowed, std::memory_order_relaxed);
}

void set_bf16_dot_for_testing(bool allowed) {
  g_bf16_dot_allowed.store(allowed, std::memory_order_relaxed);
}

bool bf16_dot_products() {
  static const bool hw = hardware_bf16();
  return hw && current_isa() == kAvx512 && g_bf16_dot_allowed.load(std::memory_order_relaxed);
}

bool packed_weights_preferred() {
  return default_isa() >= kAvx2;
}

WeightMatrix packed_bf16_view(const WeightMatrix& dense, const void* dst) {
  if (dense.format != WeightFormat::Dense || dense.dtype != DType::BF16 || dense.cols % 2 != 0)
    fail("pack_bf16_rows16: a %lld x %lld %s matrix cannot be packed (dense BF16, even cols)",
         (long long)dense.rows, (long long)dense.cols,
         std::string(dtype_name(dense.dtype)).c_str());
  WeightMatrix p = dense;
  p.format = WeightFormat::PackedBf16;
  p.data = dst;
  return p;
}

void pack_bf16_rows16(const WeightMatrix& dense, void* dst, int64_t b0, int64_t b1) {
  const WeightMatrix p = packed_bf16_view(dense, dst);
  static const bool hw = hardware_bf16();
  const detail::PackedKernels& k =
      hw && default_isa() == kAvx512 ? detail::kAvx512PackedKernels : detail::kScalarPackedKernels;
  k.pack(static_cast<const uint16_t*>(dense.data), p.rows, p.cols, static_cast<uint16_t*>(dst), b0,
         b1);
}

namespace {

// The PackedAffine kernels of the current ISA: AVX-512 VNNI, AVX-VNNI, else
// AVX2's vpmaddubsw (an AVX-512 processor without VNNI uses the 256-bit
// ones); null on the portable path (kScalarQuant takes the matrices there).
const detail::QuantKernels* packed_affine_kernels() {
  static const bool avx512_vnni = hardware_vnni(true), avx_vnni = hardware_vnni(false);
  const bool vnni = g_vnni_allowed.load(std::memory_order_relaxed);
  switch (current_isa()) {
    case kAvx512:
      if (vnni && avx512_vnni) return &detail::kAvx512VnniPackedQuant;
      [[fallthrough]];
    case kAvx2: return vnni && avx_vnni ? &detail::kAvxVnniPackedQuant : &detail::kAvx2PackedQuant;
    default: return nullptr;
  }
}

}  // namespace

bool packed_affine_preferred(int bits) {
  // AVX2 without VNNI (measured on the 2-core EPYC, TANDEM_ISA=avx2, bench/gemv --no-vnni):
  // 4-bit prefill 1.3-1.9x and decode +10-40% packed, 8-bit prefill ~1.1x but decode -5 to -18%
  // on llama-3.2-1B's shapes.
  const detail::QuantKernels* k = packed_affine_kernels();
  return k && !(k == &detail::kAvx2PackedQuant && bits == 8);
}

WeightMatrix packed_affine_view(const WeightMatrix& affine, void* dst) {
  check_affine(affine, "pack_affine_rows16");
  if (affine.format != WeightFormat::Affine)
    fail("pack_affine_rows16: a %lld x %lld matrix of format %d is not MLX affine",
         (long long)affine.rows, (long long)affine.cols, int(affine.format));
  WeightMatrix p = affine;
  p.format = WeightFormat::PackedAffine;
  auto* base = static_cast<uint8_t*>(dst);
  const size_t codes = p.row_bytes() * size_t(p.stored_rows());
  const size_t scales = size_t(p.stored_rows() * p.groups()) * dtype_size(p.dtype);
  p.data = base;
  p.scales = base ? base + codes : nullptr;
  p.biases = base ? base + codes + scales : nullptr;
  return p;
}

void pack_affine_rows16(const WeightMatrix& affine, const WeightMatrix& packed, int64_t b0,
                        int64_t b1) {
  detail::pack_affine_blocks(affine, packed, b0, b1);
}

int64_t gemm_min_rows() {
  return detail::kStreamMaxN + 1;
}

void set_quant_reference_for_testing(bool enabled) {
  g_quant_reference.store(enabled, std::memory_order_relaxed);
}

bool set_isa_for_testing(std::string_view isa) {
  if (isa.empty()) {
    g_forced_isa.store(-1, std::memory_order_relaxed);
    return true;
  }
  Isa want;
  if (!parse_isa(isa, &want) || want > hardware_isa()) return false;
  g_forced_isa.store(want, std::memory_order_relaxed);
  return true;
}

namespace {

// Runs gemm(t0, tn, r0, r1) — activation rows [t0, t0 + tn) against output
// rows [r0, r1) — over the pool: split over output rows in groups of
// row_group when there are enough of them (W is read once in total), else
// over activation rows.
template <class Gemm>
void split_gemm(ThreadPool& pool, int64_t n, int64_t rows, int64_t cols, Gemm&& gemm,
                int64_t row_group = kRowGroup) {
  const int64_t row_groups = (rows + row_group - 1) / row_group;
  if (row_groups >= 2 * int64_t(pool.size())) {
    const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / (row_group * cols * n));
    pool.parallel_for(row_groups, grain, [&](int64_t b, int64_t e) {
      gemm(0, n, b * row_group, std::min(e * row_group, rows));
    });
  } else {
    const int64_t groups = (n + kTokenGroup - 1) / kTokenGroup;
    const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / (kTokenGroup * cols * rows));
    pool.parallel_for(groups, grain, [&](int64_t b, int64_t e) {
      const int64_t t0 = b * kTokenGroup, t1 = std::min(e * kTokenGroup, n);
      gemm(t0, t1 - t0, 0, rows);
    });
  }
}

// The PackedBf16 kernels in use: AVX-512 where the processor has AVX-512
// BF16 and that path is on, AVX2 + FMA (f32 products only) where that is
// the widest, else the portable loops.
const detail::PackedKernels& packed_kernels() {
  static const bool hw = hardware_bf16();
  switch (current_isa()) {
    case kAvx512:
      if (hw) return detail::kAvx512PackedKernels;
      [[fallthrough]];
    case kAvx2: return detail::kAvx2PackedKernels;
    default: return detail::kScalarPackedKernels;
  }
}

// Output rows per scheduling unit over packed weights: whole micro-tile
// panels of the prefill kernels (3 and 2 row vectors of 16; decode's 4 + 2),
// and still 6 units for a 512-row k/v projection, so both threads stream.
constexpr int64_t kPackedRowGroup = 96;

void matmul_packed(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w,
                   const float* bias, float* y) {
  const detail::PackedKernels& k = packed_kernels();
  const int64_t rows = w.rows, cols = std::max<int64_t>(w.cols, 1);
  split_gemm(
      pool, n, rows, cols,
      [&](int64_t t0, int64_t tn, int64_t r0, int64_t r1) {
        k.matmul_f32(x + t0 * w.cols, tn, w, bias, y + t0 * rows, r0, r1);
      },
      kPackedRowGroup);
}

// matmul's Bf16 inputs over BF16 weights (dense or packed): x rounded once
// (split over the pool by rows of at least 16K values: by the calling thread
// alone it took ~1.5% of a llama-3.2-1B prefill while the other core
// waited), then the bf16 GEMM, or the f32 kernels on the rounded values.
void matmul_bf16_inputs(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w,
                        const float* bias, float* y) {
  const size_t count = size_t(n * w.cols);
  const bool packed = w.format == WeightFormat::PackedBf16;
  if (n >= gemm_min_rows() && bf16_dot_products()) {
    thread_local std::vector<uint16_t> rounded;
    if (rounded.size() < count) rounded.resize(count);
    // The workers write and read this thread's buffer (a thread_local named
    // inside the lambdas would be each worker's own).
    uint16_t* xb = rounded.data();
    const int64_t rows = w.rows, cols = std::max<int64_t>(w.cols, 1);
    pool.parallel_for(n, std::max<int64_t>(1, 16384 / cols), [&](int64_t b, int64_t e) {
      detail::kAvx512Bf16Kernels.round(x + b * w.cols, (e - b) * w.cols, xb + b * w.cols);
    });
    if (packed) {
      const detail::PackedKernels& k = packed_kernels();
      split_gemm(
          pool, n, rows, cols,
          [&](int64_t t0, int64_t tn, int64_t r0, int64_t r1) {
            k.matmul_bf16(xb + t0 * w.cols, tn, w, bias, y + t0 * rows, r0, r1);
          },
          kPackedRowGroup);
      return;
    }
    const detail::Bf16Kernels& k = detail::kAvx512Bf16Kernels;
    split_gemm(pool, n, rows, cols, [&](int64_t t0, int64_t tn, int64_t r0, int64_t r1) {
      k.gemm(xb + t0 * w.cols, tn, w, bias, y + t0 * rows, r0, r1);
    });
    return;
  }
  thread_local std::vector<float> rounded;
  if (rounded.size() < count) rounded.resize(count);
  for (size_t i = 0; i < count; ++i) rounded[i] = bf16_to_f32(f32_to_bf16(x[i]));
  matmul(pool, rounded.data(), n, w, bias, y);
}

}  // namespace

void matmul(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w, const float* bias,
            float* y, MatmulInputs inputs) {
  if (w.format == WeightFormat::Affine) {
    check_affine(w, "matmul");
    if (g_quant_reference.load(std::memory_order_relaxed))
      return quant_reference(pool, x, n, w, bias, y);
    return detail::quant_matmul(pool, quant_kernels(), x, n, w, bias, y);
  }
  if (w.format == WeightFormat::PackedAffine) {
    check_affine(w, "matmul");
    if (g_quant_reference.load(std::memory_order_relaxed))
      return quant_reference(pool, x, n, w, bias, y);
    const detail::QuantKernels* k = packed_affine_kernels();
    return detail::quant_matmul(pool, k ? *k : detail::kScalarQuant, x, n, w, bias, y);
  }
  if (w.format == WeightFormat::PackedBf16) {
    if (n <= 0 || w.rows <= 0) return;
    if (inputs == MatmulInputs::Bf16) return matmul_bf16_inputs(pool, x, n, w, bias, y);
    return matmul_packed(pool, x, n, w, bias, y);
  }
  if (w.format != WeightFormat::Dense) fail("matmul: unknown weight format %d", int(w.format));
  if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16)
    fail("matmul: weight dtype %s is not supported (expected F32, F16 or BF16)",
         std::string(dtype_name(w.dtype)).c_str());
  if (n <= 0 || w.rows <= 0) return;
  if (inputs == MatmulInputs::Bf16 && w.dtype == DType::BF16)
    return matmul_bf16_inputs(pool, x, n, w, bias, y);
  const IsaKernels& k = kernels();
  const int64_t rows = w.rows, cols = std::max<int64_t>(w.cols, 1);
  const int64_t row_groups = (rows + kRowGroup - 1) / kRowGroup;

  if (n <= detail::kStreamMaxN) {
    // Decode (and small n): each thread streams its own contiguous band of W.
    const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / (kRowGroup * cols * n));
    pool.parallel_for(row_groups, grain, [&](int64_t b, int64_t e) {
      k.stream(x, n, w, bias, y, b * kRowGroup, std::min(e * kRowGroup, rows));
    });
    return;
  }

  split_gemm(pool, n, rows, cols, [&](int64_t t0, int64_t tn, int64_t r0, int64_t r1) {
    k.gemm(x + t0 * w.cols, tn, w, bias, y + t0 * rows, r0, r1);
  });
}

float dot(const float* a, const float* b, int64_t n) {
  return kernels().dot(a, b, n);
}

namespace {
const detail::AttentionKernels& attention_kernels() {
  static const detail::AttentionKernels avx2 = {
      detail::kScalarAttention.scores, detail::kScalarAttention.values,
      detail::kScalarAttention.exp_sum, detail::kAvx2Attention.tile};
  switch (current_isa()) {
    case kAvx512: return detail::kAvx512Attention;
    case kAvx2: return avx2;
    default: return detail::kScalarAttention;
  }
}
}  // namespace

void attention_scores(const float* q, int nq, int64_t q_stride, const float* k, int64_t k_stride,
                      int64_t nk, int64_t dim, float scale, float* s, int64_t s_stride) {
  attention_kernels().scores(q, nq, q_stride, k, k_stride, nk, dim, scale, s, s_stride);
}

void attention_values(const float* p, int nq, int64_t p_stride, const float* v, int64_t v_stride,
                      int64_t nk, int64_t dim, float* out, int64_t out_stride) {
  attention_kernels().values(p, nq, p_stride, v, v_stride, nk, dim, out, out_stride);
}

bool attention_tile_supported(int64_t dim) {
  return attention_kernels().tile && (dim == 64 || dim == 128 || dim == 256 || dim == 512);
}

size_t attention_tile_floats(int64_t dim) {
  // Queries and outputs transposed, a block's probabilities.
  return size_t(2 * kTileRows * dim + kTileRows * kTileRows);
}

void attention_tile(const TileRows& rows, const KeyBlock* blocks, int64_t nblocks, int64_t stride,
                    int64_t dim, float scale, float* scratch) {
  if (!attention_tile_supported(dim))
    fail("attention_tile: head dim %lld is not supported", (long long)dim);
  attention_kernels().tile(rows, blocks, nblocks, stride, dim, scale, scratch);
}

const detail::GatedKernels& detail::gated_kernels() {
  switch (current_isa()) {
    case kAvx512: return detail::kAvx512Gated;
    case kAvx2: return detail::kAvx2Gated;
    default: return detail::kScalarGated;
  }
}

float exp_shifted_sum(float* x, int64_t n, float shift) {
  return attention_kernels().exp_sum(x, n, shift);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  kernels().axpy(a, x, y, n);
}

}  // namespace tandem::cpu
