// The CUDA backend's kernels, as host functions over device pointers, each
// enqueued on `stream` (asynchronous; errors surface at the next check).
// Contracts match the CPU backend's (backend/cpu/kernels.h, ops.h): f32
// activations, bf16 weights widened to f32, f32 accumulation — so every
// kernel is tested against the CPU reference (tests/cuda/).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace tandem::cuda {

// The gated activation a GEMV may apply to its output (GemvFusion::gate).
enum class GemvGate { None, SiLU, GeluTanh };

// What a decode GEMV does around y = x · Wᵀ, so that a batch-1 step does not
// pay a kernel (its launch and ramp-up, ~3 µs) for each small op between
// two projections. Every field is optional; the default is the plain GEMV.
//  - normalize: the product uses rmsnorm(x[t]) · norm_weight (no weight when
//    null) over the cols of x, eps norm_eps: x is the raw residual stream,
//    and the kernel computes its RMS in the same pass as the product;
//  - bias[r] is added to output row r (before the gate);
//  - accumulate: y[t, r] += result (the residual add), else y[t, r] = result;
//  - gate: W holds 2F rows, the gate's then the up projection's; y is
//    [n, F] with y[t, j] = act(gate row j) · (up row j) (the gated MLP).
//  - pre_add (Gemma's sandwich norms; gemv_affine, and gemv_bf16 over
//    cols % 8 == 0 only): the input row is h' = x + rmsnorm(pre_add) ·
//    pre_add_weight (eps norm_eps), normalized as above when normalize is
//    set (else the product takes h' itself), and the kernel also writes h'
//    to residual_out ([n, cols]; must not alias x or pre_add). So the
//    residual add of a block's output norm (and the next input norm) ride
//    in the next projection. Each thread block stages h' in shared memory
//    first (gemv.cu, gemv_bf16_pre_add). Batches of up to
//    kGemvPreAddMaxRows rows. pre_add_scale multiplies h' (Gemma 4's layer
//    scalar, when its per-layer block's output norm and residual add ride
//    in the next layer's q/k/v projection). Without normalize: Gemma 4's
//    per-layer gate, which reads the stream after the MLP's output norm
//    and residual add.
//  - times (not with gate or accumulate): y[t, r] = act(result) ·
//    times[t · times_stride + r], act by times_act (Gemma 4's per-layer
//    gate, whose activation multiplies the token's per-layer input).
//  - quantized_out (gemv_affine only: gated, 4-bit weights, batches of
//    gemv_affine_quantized_out_fits): the outputs are not written to y but
//    quantized, as the next packed 4-bit GEMV's activations, into this
//    scratch (gemv_affine_scratch_bytes(4, n, rows / 2) bytes) — in the
//    GEMV's own epilogue, where each thread block holds 32 whole outputs, so
//    the down projection needs no quantize kernel of its own;
//  - quantized_in (gemv_affine only): the activations, already quantized by
//    a quantized_out of the same width; x is not read (and the norm fusions
//    must be off).
// accumulate and gate exclude each other.
constexpr int64_t kGemvPreAddMaxRows = 2;
struct GemvFusion {
  bool normalize = false;
  const float* norm_weight = nullptr;
  float norm_eps = 0.f;
  const float* bias = nullptr;
  bool accumulate = false;
  GemvGate gate = GemvGate::None;
  const float* pre_add = nullptr;
  const float* pre_add_weight = nullptr;
  float* residual_out = nullptr;
  float pre_add_scale = 1.f;
  const float* times = nullptr;
  int64_t times_stride = 0;
  GemvGate times_act = GemvGate::None;
  uint8_t* quantized_out = nullptr;
  const uint8_t* quantized_in = nullptr;
};

// y[t, r] = Σ_c W[r, c] · x[t, c] for t < n, r < rows: the decode GEMV
// (n = batch, small), with the fusions above. W: [rows, cols] bf16,
// row-major; x: [n, cols] f32; y: [n, rows] f32 ([n, rows / 2] gated). A
// warp streams one to four rows with 16-byte loads (when cols % 8 == 0),
// keeping up to 8 batch rows in registers.
void gemv_bf16(const uint16_t* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
               cudaStream_t stream, const GemvFusion& fusion = {});

// How many warps gemv_bf16 splits each warp unit's columns over for this
// shape (1, 2, 4 or 8): more when the rows alone would leave the device's
// SMs short of warps, and so of loads in flight: the most that fit in one
// wave (TANDEM_CUDA_GEMV_WAVES; gemv_affine over its packed words: the
// fewest that give every SM 16 warps, TANDEM_CUDA_GEMV_WARPS, which is the
// same within its 4 blocks an SM). Batches of 1 and 2 only.
int gemv_bf16_split(int64_t rows, int64_t cols, int64_t n, bool gated);
// gemv_bf16's launch over 16-byte-aligned rows (cols % 8 == 0) at a batch of
// 1 or 2: rows a warp streams (a gated warp's gate and up rows counted), the
// column split, the warps launched, and the warps one wave of its blocks
// holds on this device (every SM full) — warps / wave_warps past 1 leaves a
// tail of warps running after the first wave. For benchmarks and tests.
struct GemvLaunchShape {
  int rows_per_warp = 0, split = 1;
  int64_t warps = 0, wave_warps = 0;
};
GemvLaunchShape gemv_bf16_launch_shape(int64_t rows, int64_t cols, int64_t n, bool gated);

// Whether gemv_bf16's sandwich-norm kernel (GemvFusion::pre_add) fits the
// current device's shared memory for n batch rows of `cols` (it stages
// 2n + 1 rows of cols floats): up to ~11,000 columns at two rows on an
// H200. Callers fall back to the unfused kernels where it does not.
bool gemv_pre_add_fits(int64_t n, int64_t cols);

// Whether p suits the kernels' 16-byte vector loads.
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// y[t * ldy + r] = Σ_c w[r, c] · x[t, c] for t < n ≤ kSkinnyGemmMaxTokens,
// r < m: the batched decode steps' GEMM over bf16 weights ([m, cols]) and
// bf16 activations ([n, cols]), f32 out, on tensor cores, each weight read
// once (skinny_gemm.cu). Only where skinny_gemm_fits (16-byte aligned
// operands, cols a multiple of 16); the caller takes cuBLAS elsewhere.
constexpr int kSkinnyGemmMaxTokens = 32;
bool skinny_gemm_fits(const uint16_t* w, int64_t m, int64_t cols, const uint16_t* x, int64_t n);
// The 16-row groups (gated: 8 gate/up pairs) of a matrix of m rows (gated:
// gate and up rows): the units that the layouts below share out.
inline int64_t skinny_units(int64_t m, bool gated) {
  return gated ? (m / 2 + 7) / 8 : (m + 15) / 16;
}
// row_groups: 16-row groups a block takes, 1 or kSkinnyRowGroups (its warps
// in teams over the same activation columns, which then come from L1 for
// all but one team: for steps of 17-32 tokens over large matrices, where
// the activations' L2 traffic outgrows the weights'; opt-in, see the
// decoder's skinny_row_groups).
constexpr int kSkinnyRowGroups = 4;
// col_splits: blocks of a thread-block cluster that share each 16-row
// group's columns (1 to kSkinnyMaxColSplits; above 1 only with one row group
// a block, on sm_90+), so a matrix of few rows still fills the SMs.
// skinny_col_splits gives the splits for a matrix of m rows (gated: gate and
// up rows) and `cols` columns on the current device, at most `most`: where
// its row groups leave a quarter of the SMs idle, enough for a block an SM,
// each warp still taking two 64-column steps; else 1 (and 1 on devices
// without clusters).
constexpr int kSkinnyMaxColSplits = 4;
int skinny_col_splits(int64_t m, int64_t cols, bool gated, int most);
void skinny_gemm_bf16(const uint16_t* w, int64_t m, int64_t cols, const uint16_t* x, int64_t n,
                      float* y, int64_t ldy, cudaStream_t stream, int row_groups = 1,
                      int col_splits = 1);
// The same over a fused gate/up matrix (w: [2F, cols], the F gate rows then
// the F up rows) with the gated MLP's activation in the epilogue:
// y[t, j] = act(gate_j · x[t]) · (up_j · x[t]) for j < F ([n, F] f32),
// and when y_bf16 is set the same values rounded to bf16 (nearest even)
// there ([n, F]; the next GEMM's input; must not alias x). Where
// skinny_gemm_fits(w, 2F, cols, x, n); act is SiLU or GeluTanh.
void skinny_gemm_gated_bf16(const uint16_t* w, int64_t F, int64_t cols, const uint16_t* x,
                            int64_t n, GemvGate act, float* y, uint16_t* y_bf16,
                            cudaStream_t stream, int row_groups = 1, int col_splits = 1);

// The plain product with Gemma 4's per-layer gate in the epilogue:
// y[t, r] = act(w_r · x_t) · times[t · times_stride + r] ([n, m] f32; act
// SiLU or GeluTanh, times_stride ≥ m), and when y_bf16 is set the same
// values rounded to bf16 there ([n, m]: the next GEMM's input). Where
// skinny_gemm_fits(w, m, cols, x, n).
void skinny_gemm_times_bf16(const uint16_t* w, int64_t m, int64_t cols, const uint16_t* x,
                            int64_t n, GemvGate act, const float* times, int64_t times_stride,
                            float* y, uint16_t* y_bf16, cudaStream_t stream, int row_groups = 1,
                            int col_splits = 1);

// gemv_bf16 over f32 weights (W: [rows, cols] f32).
void gemv_f32(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
              cudaStream_t stream, const GemvFusion& fusion = {});

// y[t, i] += b[i] for t < n, i < dim.
void add_bias(float* y, const float* b, int64_t n, int64_t dim, cudaStream_t stream);
// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);
// x[i] *= s
void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream);
// out[t] = table[ids[t]] · scale, f32 rows.
void embed_rows_f32(const float* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                    float* out, cudaStream_t stream);

// y[t] = x[t] · rsqrt(mean(x[t]²) + eps) · w over n rows of dim (in place
// allowed); w already holds Gemma's +1; null w: no weight. y_bf16 (when
// set): y rounded to bf16 as split_bf16's hi part rounds it, the input of a
// bf16 GEMM without a split launch of its own (the same for residual_norm's
// x_bf16 and the gated activations' out_bf16).
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
             cudaStream_t stream, uint16_t* y_bf16 = nullptr);

// gate[i] = act(gate[i]) · up[i], i < n.
void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);
void gelu_tanh_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);

// x[i] = cap · tanh(x[i] / cap)
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// dst[i] = src[idx[i]] rows of `dim` f32, i < n (idx device).
void gather_rows(const float* src, const int32_t* idx, int64_t n, int64_t dim, float* dst,
                 cudaStream_t stream);
// dst[idx[i]] = src[i] rows of `dim` f32, i < n (idx device).
void scatter_rows(const float* src, const int32_t* idx, int64_t n, int64_t dim, float* dst,
                  cudaStream_t stream);
// y[i] = (y[i] + x[i]) · s
void add_then_scale(float* y, const float* x, int64_t n, float s, cudaStream_t stream);
// gate[r, i] = act(gate[r, i]) · up[r · up_stride + i] for r < rows, i < dim
// (Gemma 4's per-layer gate over its slice of the per-layer inputs); and,
// when gate_bf16 is set, the same values rounded to bf16 there ([rows,
// dim]: the per-layer projection's GEMM input, as rmsnorm's y_bf16).
void gelu_tanh_mul_strided(float* gate, const float* up, int64_t up_stride, int64_t rows,
                           int64_t dim, cudaStream_t stream, uint16_t* gate_bf16 = nullptr);
void silu_mul_strided(float* gate, const float* up, int64_t up_stride, int64_t rows, int64_t dim,
                      cudaStream_t stream, uint16_t* gate_bf16 = nullptr);
// dst[i] = src[i] + src[half + i], i < half: the two halves of a GEMM over
// stacked hi/lo operands.
void add_halves(const float* src, int64_t half, float* dst, cudaStream_t stream);
// Splits f32 values into two bf16 parts for tensor-core GEMMs that keep f32
// accuracy: hi[i] = bf16(src[i]), lo[i] = bf16(src[i] - hi[i]) (round to
// nearest even), so hi + lo carries 16 significant bits. With lo null,
// only hi: the values rounded to bf16.
void split_bf16(const float* src, int64_t n, uint16_t* hi, uint16_t* lo, cudaStream_t stream);

// out[t] = table[ids[t]] · scale (rows of `dim` bf16 widened to f32).
void embed_rows_bf16(const uint16_t* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                     float* out, cudaStream_t stream);

// Where each token of a step sits (device arrays, so a captured CUDA graph
// replays with new contents): token t is at positions[t], sees keys below
// key_end[t] (exclusive: positions[t] + 1 when causal, the end of its image
// run when bidirectional) and belongs to sequence seq[t], whose blocks of the
// layer's kind are tables[table_start[seq[t]] + i] for positions
// [(first_block[seq[t]] + i) · block_size, ...) (first_block null: 0).
struct StepLayout {
  const int64_t* positions = nullptr;    // [n]
  const int64_t* key_end = nullptr;      // [n]
  const int32_t* seq = nullptr;          // [n]
  const int32_t* tables = nullptr;       // every sequence's block ids, back to back
  const int32_t* table_start = nullptr;  // [S]
  const int64_t* first_block = nullptr;  // [S] or null
};

// Paged attention over f32 or bf16 K/V rows, the CPU backend's contract
// (cpu::attention, whose rows are the bf16 values widened when kv_bf16)
// per token: keys [max(0, pos - window + 1), key_end); scores q·k · scale,
// soft-capped when softcap > 0; query head h reads kv head h / (heads /
// kv_heads); position p of a sequence lives in row p % block_size of its
// block for p / block_size. Each (token, head) is split over `splits` key
// ranges (flash-decoding: few tokens, long contexts), each kept as an online
// softmax; the query heads of one kv head share a block, so each K/V row is
// read once for all of them (GQA). Splits are merged by a second kernel when
// splits > 1 through `partial` (attention_partial_floats of it).
struct PagedAttention {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // head_dim ≤ 512
  float scale = 1.f, softcap = 0.f;
  int64_t window = 0;
  const void* k_base = nullptr;  // f32 rows, or bf16 when kv_bf16
  const void* v_base = nullptr;
  bool kv_bf16 = false;
  int64_t block_size = 0;  // a power of two
  int block_shift = 0;     // log2(block_size), set by attention_paged
  int splits = 1;
  float* partial = nullptr;
  // The tensor-core decode kernel only: warps of a block that split its keys
  // further and merge in shared memory (1, or attention_decode_key_warps),
  // so a block's split needs no combine of its own.
  int key_warps = 1;
  // The tensor-core decode kernel only: take the chunked kernel
  // (attention_decode_chunked: a block's warps share each 128-key chunk,
  // scores split by key, values by output dim) — for grids of few (token,
  // kv head) units, where a block's instruction chain, not the rows' bytes,
  // sets the time. splits then cut the keys over blocks; key_warps is unused.
  bool chunked = false;
  // The chunked kernel only: with 2 to attention_decode_cluster_max_splits
  // splits, each (token, kv head)'s splits run as one thread-block cluster
  // and merge through distributed shared memory (sm_90+), so the combine
  // kernel does not run (attention_decode_chunked_merges); `partial` is
  // then not written (attention_paged still asks for it with splits > 1).
  bool merge_in_cluster = false;
  // Tests: the chunked kernel copies rows with cp.async (as before sm_90)
  // even where bulk copies exist.
  bool cp_async_only = false;
  // The tensor-core decode kernel only: every token of the step is its
  // sequence's only one (decode steps), so the one key an earlier kernel of
  // the step writes for a token is its own position; the kernel copies the
  // others of its first tile before waiting for those kernels (PDL).
  bool one_new_key = false;
  // The tensor-core kernels (attention_prefill, attention_decode_mma): q·scale
  // and the softmax weights rounded to bf16 (one tensor-core product per
  // product instead of two or three: the decoder's --gemm-precision bf16,
  // the default); else their bf16 hi/lo parts.
  bool bf16_inputs = false;
  // The device's SM count, when known: a grid of (token, kv head, split)
  // blocks that fills it keeps each kv head's query heads in one block.
  int multiprocessors = 0;
  // When set ([n, heads·head_dim]), every kernel that writes a final output
  // value also writes it rounded to bf16 here: the o projection's GEMM input
  // under bf16 GEMM inputs, so it needs no split_bf16 launch (the decoder's
  // bf16 twin).
  uint16_t* out_bf16 = nullptr;
  // When set, every kernel that writes a final output value (the tensor-core
  // decode kernels and the split combine: attention_quantizes_out) also
  // writes token t's output row as a 4-bit GEMV's quantized activations, at
  // out_quantized + t · gemv_affine_quantized_row_bytes(heads · head_dim):
  // the o projection's input (GemvFusion::quantized_in), so it needs no
  // quantize launch (attention_quant.h; the decoder's quantized_o).
  uint8_t* out_quantized = nullptr;
};
// q, out: [n, heads·head_dim]. Two kernels keep this contract: one on
// tensor cores (attention_decode_mma: bf16 rows, up to 16 query heads per kv
// head, head dim 64, 128, 256 or 512; q·scale as bf16 hi/lo parts, so about
// 1e-5 relative error per output against the CPU's 1e-7, or rounded to bf16
// with bf16_inputs, about 2e-3) — or, with p.chunked, its chunked variant
// at head dim 64, 128 or 256 (the same numerics) — and one on CUDA cores for
// the rest. Auto takes the first where it can (unless
// TANDEM_CUDA_DECODE_MMA=0); the tests ask for each.
// With `fused_post` (p.chunked, where attention_decode_chunked_fuses_post
// says so), q is the raw q/k/v projection and the chunked kernel does
// qkv_post's work itself (the query heads' norm, RoPE and temperature, the
// new K and V rows' norm, RoPE and cache write): no qkv_post launch.
struct QkvPost;
enum class DecodeKernel { Auto, TensorCores, CudaCores };
void attention_paged(const float* q, int64_t n, const StepLayout& at, const PagedAttention& p,
                     float* out, cudaStream_t stream, DecodeKernel kernel = DecodeKernel::Auto,
                     const QkvPost* fused_post = nullptr);
// Whether attention_paged can take the tensor-core kernel for `p` (and
// TANDEM_CUDA_DECODE_MMA is not 0). Its launch, without the split combine:
bool attention_decode_mma_supported(const PagedAttention& p);
// Whether attention_paged's decode kernels fill PagedAttention::out_quantized
// for p: the tensor-core kernels, head dims a multiple of 32 (a quantized
// block of 32 columns inside one head). Elsewhere (the CUDA-core kernel,
// the prefill kernels) setting it is an error.
bool attention_quantizes_out(const PagedAttention& p);
// The most warps a block of that kernel splits its keys over for p's head
// dim (8 at dims 64 and 256, 4 at 128, else 1: attention_decode.cu says
// why), and the keys of the tile its warps copy and compute at a time.
int attention_decode_key_warps(const PagedAttention& p);
int attention_decode_tile_keys(const PagedAttention& p);
// How many of that kernel's one-warp blocks (key_warps 1) of p's head dim
// an SM of the current device holds at once (its shared memory bounds them:
// 2 at dim 512 on sm_90), so a split rule can keep the grid in one wave.
int attention_decode_one_warp_blocks_per_sm(const PagedAttention& p);
void attention_decode_mma(const float* q, int64_t n, const StepLayout& at, const PagedAttention& p,
                          float* out, cudaStream_t stream);
// Whether the chunked kernel takes p (the tensor-core kernel's shapes at head
// dim 64, 128 or 256), the keys of its chunk (a block's keys per pass) and
// the warps of its block; its launch is declared after QkvPost below.
bool attention_decode_chunked_supported(const PagedAttention& p);
int attention_decode_chunk_keys();
int attention_decode_chunked_warps(int64_t head_dim);  // 8, or 4 at head dim 64
// The most splits the chunked kernel merges in one cluster at this head dim
// on the current device (PagedAttention::merge_in_cluster; 1: none, as
// before sm_90), and whether it merges p's splits so (no combine kernel).
int attention_decode_cluster_max_splits(int64_t head_dim);
bool attention_decode_chunked_merges(const PagedAttention& p);
// The same contract on tensor cores (flash attention) for steps that carry
// runs of a sequence's consecutive tokens (prefill chunks): `tiles` (device,
// [2 · n_tiles]) holds each query tile's first and one-past-last step token,
// at most 64 tokens of one sequence (attention_prefill_tiles makes them).
// Scores and outputs are bf16 hi/lo tensor-core products (three per
// product; two over bf16 rows, whose lo part is zero) with f32
// accumulation; splits and partial are not used.
// Supported where attention_prefill_supported says so (sm_80+, head_dim a
// multiple of 16 up to 512, and its shared memory fits the device).
void attention_prefill(const float* q, const StepLayout& at, const int32_t* tiles, int64_t n_tiles,
                       const PagedAttention& p, float* out, cudaStream_t stream);
bool attention_prefill_supported(int64_t head_dim, int device);
// The same contract for the CUDA defaults (p.kv_bf16 and p.bf16_inputs) at
// head dims 64, 128, 256 and 512, one tensor-core product per product, built for
// throughput (attention_prefill_bf16.cu); attention_prefill hands it these
// shapes unless TANDEM_CUDA_PREFILL_BF16=0. split: the warps that share 16
// query rows (1, or 2 at head dims 256 and 512); 0 takes the head dim's
// default (2 at 512), another is for tests and measuring.
void attention_prefill_bf16(const float* q, const StepLayout& at, const int32_t* tiles,
                            int64_t n_tiles, const PagedAttention& p, float* out,
                            cudaStream_t stream, int split = 0);
bool attention_prefill_bf16_takes(const PagedAttention& p, int device, int split = 0);
// Query tiles for n step tokens whose sequences are seq[0..n): runs of the
// same sequence, cut every 64 tokens, as (first, end) pairs.
std::vector<int32_t> attention_prefill_tiles(const int32_t* seq, int64_t n);
// Which kernel takes which tokens of a step that carries prefill runs:
// tokens [0, decode_tokens) are single tokens of their sequences (decode),
// for attention_paged, which reads each K/V row once per kv head; `tiles`
// (absolute step tokens) cover the rest, for attention_prefill, where a
// lone token would be a 64-row tile re-reading its context once per query
// head. The engine schedules decode tokens first; a single token after the
// first run is tiled like the rest.
struct PrefillAttentionPlan {
  int64_t decode_tokens = 0;
  std::vector<int32_t> tiles;
};
PrefillAttentionPlan plan_prefill_attention(const int32_t* seq, int64_t n);
// Key-range splits worth using for n tokens of `kv_heads` KV heads (one
// block each) on a device of `multiprocessors` SMs: enough (token, kv head,
// split) blocks for `blocks_per_sm` per SM (2 for the CUDA-core kernel's
// 128-thread blocks, 8 for the tensor-core kernel's one-warp blocks), at
// most 64 splits unless TANDEM_ATTENTION_MAX_SPLITS says up to 128. Then
// n · kv_heads · splits < 2 · blocks_per_sm · multiprocessors.
constexpr int kCudaCoreBlocksPerSm = 2, kTensorCoreBlocksPerSm = 8;
int attention_splits(int64_t n, int64_t kv_heads, int multiprocessors,
                     int blocks_per_sm = kCudaCoreBlocksPerSm);
size_t attention_partial_floats(int64_t n, int64_t heads, int64_t head_dim, int splits);

// An unfused part of qkv_post (its tests' reference): rotate-half RoPE in
// place on x [n, heads, head_dim] for positions[t]
// (device, [n]): dims i and i + rotary_dim/2 (i < rotary_dim/2) rotate by
// angle = float(pos) · inv_freq[i] (f32, as transformers), cos and sin
// times `scaling`.
void rope_rotate_half(float* x, int64_t n, int64_t heads, int64_t head_dim,
                      const int64_t* positions, const float* inv_freq, int64_t rotary_dim,
                      float scaling, cudaStream_t stream);

// The attention inputs of a layer from its fused projection, one launch:
// qkv [n, stride] holds each token's q (heads·Dh), then, when the layer has
// its own KV, k (kv_heads·Dh) and v (kv_heads·Dh; none when k_eq_v: v is the
// raw k). Per head: RMSNorm (q, k with their weights when qk_norm; v without
// weight when v_norm), rotate-half RoPE on q and k, the query temperature
// on q (beta != 0: · (1 + beta · log(1 + floor(pos / base)))); q goes to
// q_out [n, heads·Dh], k and v to their paged rows (kv_write's layout;
// rounded to bf16 when kv_bf16).
struct QkvPost {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, stride = 0;
  bool own_kv = true, k_eq_v = false, qk_norm = false, v_norm = false;
  const float* q_norm = nullptr;  // [head_dim] (Gemma's +1 included) or null
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int64_t rotary_dim = 0;
  float rope_scaling = 1.f;
  float temp_beta = 0.f, temp_base = 1.f;
  float* q_out = nullptr;
  void* k_cache = nullptr;  // f32 rows, or bf16 when kv_bf16
  void* v_cache = nullptr;
  bool kv_bf16 = false;
  int64_t block_size = 0;
};
void qkv_post(const float* qkv, int64_t n, const StepLayout& at, const QkvPost& p,
              cudaStream_t stream);
// The chunked decode kernel's launch (attention_paged takes it when
// p.chunked), without the split combine; with `post`, over the raw
// projection, doing qkv_post's work — where fuses_post says it can: decode
// steps (p.one_new_key) over bf16 rows, RoPE over the whole head, the caches
// the attention reads.
bool attention_decode_chunked_fuses_post(const PagedAttention& p, const QkvPost& post);
void attention_decode_chunked(const float* q, int64_t n, const StepLayout& at,
                              const PagedAttention& p, float* out, cudaStream_t stream,
                              const QkvPost* post = nullptr);

// The residual stream between blocks, one launch: h[t] = (h[t] + d) ·
// h_scale (d = delta[t], or rmsnorm(delta[t]) · delta_w when delta_w is set:
// Gemma's post-norms; h_scale: Gemma 4's layer scalar, 1 elsewhere), then
// x[t] = rmsnorm(h[t]) · next_w (null: no weight) when x is set (the next
// block's input norm). Rows of `dim`, t < n. x_bf16: x rounded to bf16
// (rmsnorm's y_bf16); h_bf16: the new h rounded to bf16 (the input of a GEMM
// that reads the stream itself: Gemma 4's per-layer gate).
void residual_norm(float* h, const float* delta, const float* delta_w, const float* next_w,
                   float* x, int64_t n, int64_t dim, float eps, cudaStream_t stream,
                   float h_scale = 1.f, uint16_t* x_bf16 = nullptr, uint16_t* h_bf16 = nullptr);

// out[t, i] = act(gu[t, i]) · gu[t, F + i] for t < n, i < F: the gated MLP
// activation over the fused gate/up projection [n, 2F].
void silu_mul_halves(const float* gu, int64_t n, int64_t F, float* out, cudaStream_t stream,
                     uint16_t* out_bf16 = nullptr);
void gelu_tanh_mul_halves(const float* gu, int64_t n, int64_t F, float* out, cudaStream_t stream,
                          uint16_t* out_bf16 = nullptr);

// An unfused part of qkv_post (the tests' reference for its layout): writes
// rows [n, kv_dim] to the paged storage at each token's position (layout as
// PagedAttention's; bf16 rows, rounded to nearest even, when bf16).
void kv_write(const float* rows, int64_t n, int64_t kv_dim, void* base, bool bf16,
              int64_t block_size, const StepLayout& at, cudaStream_t stream);

// One row's sampling (engine/sampler.h's SamplingParams) and its draw.
struct SampleRow {
  int32_t row = 0;          // the logits row
  float temperature = 0.f;  // <= 0: greedy
  int32_t top_k = 0;
  float top_p = 1.f, min_p = 0.f;
  float repetition_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
  double uniform = 0.0;  // the draw, in [0, 1)
};
// A token the penalties of sample `sample` touch: `count` times in the
// output, `seen` when in the prompt or the output (the repetition set).
struct PenaltyToken {
  int32_t sample = 0, id = 0, count = 0, seen = 0;
};
// out[i] = the token sampled from logits row params[i].row (rows of `vocab`),
// i < samples, or -1 when that row holds a NaN: penalties applied in place first (the CPU Sampler's
// order: repetition, then presence and frequency), then greedy argmax
// (lowest id on ties) or temperature with top-k, top-p and min-p (ties at a
// cutoff are all kept) and a draw over the kept tokens in id order.
void sample_rows(float* logits, int64_t samples, int64_t vocab, const SampleRow* params,
                 const PenaltyToken* penalties, int64_t penalty_count, int32_t* out,
                 cudaStream_t stream);

// A matrix of affine-quantized weights on the device (MLX layout): codes of
// `bits` (4 or 8) packed little-endian in uint32 words, rows of
// cols · bits / 32 words (4-byte aligned: the kernels read whole words);
// scales and biases f32 [rows, cols / group], group 32, 64 or 128;
// w = scale · q + bias.
struct AffineMatrix {
  const uint32_t* data = nullptr;
  const float* scales = nullptr;
  const float* biases = nullptr;
  int bits = 4, group = 64;
  int64_t rows = 0, cols = 0;
};
// y[t, r] = Σ_c w[r, c] · x[t, c] for t < n (x and the codes 16-byte
// aligned): the decode GEMV over the packed codes, with the fusions of
// GemvFusion (pre_add where gemv_affine_pre_add_fits: any batch). As the CPU
// computes it (backend/cpu/kernels.h): each row of x (through pre_add and
// normalized first, as the fusion says) is quantized to int8 in blocks of
// 32 values, so y differs from the f32 product with the dequantized
// weights by that rounding; the integer products run on dp4a. (With
// quantized_in the rows arrive quantized by the same rule.)
// `scratch` holds the quantized rows: gemv_affine_scratch_bytes(w.bits, n,
// w.cols) bytes (enough for gemm_affine_int8's layout of n tokens too),
// 16-byte aligned (null: the call allocates its own, which
// must not happen inside a graph capture).
void gemv_affine(const AffineMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                 const GemvFusion& fusion = {}, void* scratch = nullptr, size_t scratch_bytes = 0);
size_t gemv_affine_scratch_bytes(int bits, int64_t n, int64_t cols);
// The bytes of one row of quantized activations of `cols` columns as a
// 4-bit gemv_affine reads them (GemvFusion::quantized_in: rows this far
// apart), a multiple of 16.
size_t gemv_affine_quantized_row_bytes(int64_t cols);
// Whether gemv_affine takes GemvFusion::pre_add over rows of `cols` (a
// multiple of 4, at most 12,288: the quantize kernel keeps the row in
// registers).
bool gemv_affine_pre_add_fits(int64_t cols);
// Whether gemv_affine takes GemvFusion::quantized_out for w over n batch
// rows: gated, 4 bits, n <= kQuantizedOutMaxRows, and outputs (rows / 2) a
// multiple of 32.
constexpr int64_t kQuantizedOutMaxRows = 2;
bool gemv_affine_quantized_out_fits(const AffineMatrix& w, int64_t n);
// y[t, r] = Σ_c w[r, c] · x[t, c] for t < n over 4-bit weights, with
// gemv_affine's numerics (x quantized to int8 in blocks of 32; no fusions)
// on int8 tensor cores (mma m16n8k32), without bf16 tiles of the weights:
// the decoder's steps of 5-32 tokens. scratch as gemv_affine's. (Prefill
// GEMMs over the packed codes, int8 and W4A16, were measured on the H100 in
// the twenty-sixth session at 0.38-0.67x of the bf16 tiles' speed and
// removed: docs/performance.md.)
constexpr int kAffineMmaMaxTokens = 32;
// 4 bits, and up to kAffineMmaMaxTokens tokens the decode kernel's shared
// memory fits the device.
bool affine_mma_takes(const AffineMatrix& w, int64_t n);
void gemm_affine_int8(const AffineMatrix& w, const float* x, int64_t n, float* y,
                      cudaStream_t stream, void* scratch = nullptr, size_t scratch_bytes = 0);
// gemv_bf16_split's counterpart over 16-byte vectors of packed codes (at
// least 16 a warp), by the fewest-warps rule (TANDEM_CUDA_GEMV_WARPS).
int gemv_affine_split(const AffineMatrix& w, int64_t n, bool gated);
// out[i, c] = bf16(w[r0 + i, c]) for i < m: tiles for cuBLAS prefill; and,
// when out_lo is not null, out_lo[i, c] = bf16(w - out[i, c]) (the two
// parts carry 16 significant bits).
void dequantize_affine_bf16(const AffineMatrix& w, int64_t r0, int64_t m, uint16_t* out,
                            uint16_t* out_lo, cudaStream_t stream);
// out[t] = w[ids[t]] · factor (f32 rows of cols): quantized embedding tables.
void embed_rows_affine(const AffineMatrix& w, const int32_t* ids, int64_t n, float factor,
                       float* out, cudaStream_t stream);

// Waits `ns` nanoseconds on the device (profiling: lets the host queue a
// whole step before the GPU starts it).
void device_sleep(uint64_t ns, cudaStream_t stream);

}  // namespace tandem::cuda
