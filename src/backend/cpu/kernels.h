// The CPU backend's compute kernels: f32 activations, weights dense in F32,
// F16 or BF16, or quantized (WeightMatrix::format; callers never change).
// Each entry point dispatches at run time to the widest ISA the processor
// has: AVX-512, AVX2+FMA, or portable scalar code; quantized weights use the
// VNNI int8 dot products where present (kernels_quant.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

// y[t, r] = sum_c x[t, c] * W[r, c] + (bias ? bias[r] : 0)
//   x: [n, w.cols] f32 row-major, y: [n, w.rows] f32 row-major, bias: [w.rows] or null.
// n == 1 is the decode GEMV and must stream W at memory bandwidth; larger n
// (prefill) reuses each loaded weight row across the n activations.
// Quantized W (WeightFormat::Affine): x is quantized to int8 per block of 32
// values first, so y differs from the f32 product with the dequantized
// weights by that rounding (relative error ~1e-3 of |x|·|w|).
//
// `inputs` Bf16 (dense BF16 weights only; ignored for others): each value of
// x is rounded to bf16 (nearest even) first, as vLLM and llama.cpp do in
// prefill, and y is the f32 sum of those products — the f32 product of the
// rounded x up to the order of the additions. Past gemm_min_rows() rows on a
// processor with AVX-512 BF16 the GEMM then runs on bf16 dot products
// (vdpbf16ps, twice the f32 FMA's rate) over the weights in place.
enum class MatmulInputs { F32, Bf16 };
void matmul(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w, const float* bias,
            float* y, MatmulInputs inputs = MatmulInputs::F32);

// The fewest activation rows matmul takes the cache-blocked GEMM for (fewer
// stream the weights: the decode GEMV).
int64_t gemm_min_rows();

// Whether matmul's Bf16 inputs run on bf16 dot products here (the processor
// has AVX-512 BF16, the AVX-512 path is in use, and no test turned it off).
bool bf16_dot_products();

// Weights packed for the outer-product kernels (WeightFormat::PackedBf16):
// matmul over them is the same function, 1.3-1.5x faster in prefill with
// AVX-512 BF16 and as fast with AVX2 (docs/performance.md). Loading packs
// dense BF16 matrices where packed_weights_preferred(): the run-time ISA
// (TANDEM_ISA included) is AVX2 + FMA or wider.
bool packed_weights_preferred();
// The PackedBf16 view of `dense` (BF16, cols even) stored at `dst`, which
// must hold packed.nbytes() bytes (rows padded to a multiple of 16).
WeightMatrix packed_bf16_view(const WeightMatrix& dense, const void* dst);
// Writes the 16-row blocks [b0, b1) of `dense` packed into `dst` (the
// buffer of packed_bf16_view); callers split the blocks over threads.
void pack_bf16_rows16(const WeightMatrix& dense, void* dst, int64_t b0, int64_t b1);

// Affine weights packed for the int8 outer-product kernels
// (WeightFormat::PackedAffine): matmul over them is the same function, with
// the same result up to the order of f32 additions (docs/performance.md has
// the speed). Loading packs `bits`-bit affine matrices where
// packed_affine_preferred(bits): the run-time ISA is AVX2 or wider, and for
// 8 bits the processor has VNNI (on vpmaddubsw the packed 8-bit kernel is
// no faster). Elsewhere packed matrices run on the scalar reference.
bool packed_affine_preferred(int bits);
// The PackedAffine view of `affine` stored at `dst`, which must hold
// view.nbytes() bytes (64-byte aligned): codes (rows padded to a multiple of
// 16), then scales, then biases.
WeightMatrix packed_affine_view(const WeightMatrix& affine, void* dst);
// Writes the 16-row blocks [b0, b1) of `affine` into `packed` (the matrix of
// packed_affine_view); callers split the blocks over threads.
void pack_affine_rows16(const WeightMatrix& affine, const WeightMatrix& packed, int64_t b0,
                        int64_t b1);

// Single-threaded vector helpers for attention and norms (SIMD-dispatched).
float dot(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);  // y += a * x

// The attention's blocks over rows of `dim` floats, for nq query heads that
// share their keys and values (single-threaded, SIMD-dispatched: AVX-512
// takes up to four heads per pass over the rows, AVX2 and scalar code a
// head at a time). Query head g is q + g * q_stride, key j k + j * k_stride:
//   attention_scores: s[g * s_stride + j] = scale * (q_g . k_j), j < nk;
//   attention_values: out_g += sum_j p[g * p_stride + j] * v_j (out_g =
//     out + g * out_stride);
//   exp_shifted_sum: x[i] = exp(x[i] - shift) for i < n, returning their
//     sum (AVX-512: a polynomial within ~1e-7 relative of expf).
void attention_scores(const float* q, int nq, int64_t q_stride, const float* k, int64_t k_stride,
                      int64_t nk, int64_t dim, float scale, float* s, int64_t s_stride);
void attention_values(const float* p, int nq, int64_t p_stride, const float* v, int64_t v_stride,
                      int64_t nk, int64_t dim, float* out, int64_t out_stride);
float exp_shifted_sum(float* x, int64_t n, float shift);

// Flash-style attention of up to kTileRows query rows of one kv head
// (prefill): every KV block's keys are scored for all rows at once (a
// vector lane a row, so the softmax needs no horizontal sums), the softmax
// runs online block by block, and out[m] = Σ softmax(scale · q_m · k) · v
// over the positions in [first[m], last[m]]. Blocks are kTileRows positions
// from `pos`, row i of the kv head at k + i · stride and v + i · stride
// (every row readable; only keys [j0, j1) of a block may be attended, and
// only their values are read). Blocks hold the rows' keys in increasing
// position; each row must see at least one key. Only where
// attention_tile_supported(dim) (AVX2 or AVX-512, head dims 64, 128, 256, 512);
// scratch: attention_tile_floats(dim) floats.
constexpr int kTileRows = 16;
struct TileRows {
  int count = 0;                   // rows in use, 1..kTileRows
  const float* q[kTileRows] = {};  // row m's query (dim values)
  float* out[kTileRows] = {};      // row m's output (dim values)
  int32_t first[kTileRows] = {};   // the positions row m attends, inclusive
  int32_t last[kTileRows] = {};
};
struct KeyBlock {
  const float* k;
  const float* v;
  int32_t pos, j0, j1;
};
bool attention_tile_supported(int64_t dim);
size_t attention_tile_floats(int64_t dim);
void attention_tile(const TileRows& rows, const KeyBlock* blocks, int64_t nblocks, int64_t stride,
                    int64_t dim, float scale, float* scratch);

// The ISA chosen at run time ("avx512", "avx2", "scalar"); TANDEM_ISA=avx2|scalar
// in the environment forces a narrower one (tests use it to cover each path).
std::string_view active_isa();

// The quantized-matmul kernels in use: "avx512-vnni", "avx2-vnni", "avx2" or
// "scalar".
std::string_view active_quant_isa();

// Test hook: false makes the quantized kernels ignore VNNI (the vpmaddubsw
// path); true restores the default.
void set_vnni_for_testing(bool allowed);

// Test hook: true makes matmul over quantized weights use exact f32
// activations (each weight row dequantized; slow), isolating the weights'
// rounding from the activations'; false restores the int8 kernels.
void set_quant_reference_for_testing(bool enabled);

// Test hook: false makes matmul's Bf16 inputs use the f32 kernels on the
// rounded values instead of bf16 dot products; true restores the default.
void set_bf16_dot_for_testing(bool allowed);

// Test hook: makes every later call use `isa` ("avx512", "avx2" or "scalar")
// regardless of TANDEM_ISA; "" restores the run-time choice. Returns false,
// changing nothing, when the processor lacks that ISA or the name is unknown.
bool set_isa_for_testing(std::string_view isa);

}  // namespace tandem::cpu
