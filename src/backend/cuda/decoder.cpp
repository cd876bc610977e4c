#include "backend/cuda/decoder.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/cublas_check.h"
#include "backend/cuda/decode_policy.h"
#include "backend/cuda/device_matrix.h"
#include "backend/cuda/gemm_tuner.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"
#include "model/rope.h"

namespace tandem::cuda {

namespace {

// Steps of at most Decoder::gemv_max_tokens() tokens run the GEMV kernels
// (f32 activations, f32 accumulation); larger ones a GEMM (bf16 inputs of
// up to 16 tokens: skinny_gemm_bf16), else cuBLAS: for bf16 weights
// one tensor-core GEMM over the activations split into bf16 hi + lo parts
// (16 significant bits, so prefill logits stay within ~1e-5 of the f32 path,
// where plain bf16 activations were 3e-2 to 0.6 × std off), for f32 weights
// SGEMM.
constexpr size_t kBlasWorkspace = size_t(32) << 20;

// The parts' biases back to back (zeros for a part without one), or empty
// when none has one.
DeviceBuffer upload_biases(const std::vector<std::pair<const Vec*, int64_t>>& parts,
                           size_t& total) {
  bool any = false;
  for (auto [b, rows] : parts) any = any || !b->empty();
  if (!any) return DeviceBuffer();
  std::vector<float> all;
  for (auto [b, rows] : parts) {
    if (b->empty())
      all.insert(all.end(), size_t(rows), 0.f);
    else
      all.insert(all.end(), b->begin(), b->end());
  }
  DeviceBuffer d(all.size() * sizeof(float));
  d.upload(all.data(), d.bytes());
  total += d.bytes();
  return d;
}

DeviceBuffer upload_vec(const std::vector<float>& v, size_t& total) {
  DeviceBuffer b(v.size() * sizeof(float));
  if (!v.empty()) b.upload(v.data(), b.bytes());
  total += b.bytes();
  return b;
}

float* ptr(const DeviceBuffer& b) {
  return b.bytes() ? b.as<float>() : nullptr;
}

// Page-locked host memory, so uploads are asynchronous.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
  }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct Layer {
  DeviceBuffer attn_in_norm, qkv_bias, q_norm, k_norm, o_bias, attn_out_norm, mlp_in_norm,
      gate_up_bias, down_bias, mlp_out_norm, ple_out_norm;
  DevMatrix qkv;      // q, then k and v when the layer computes its own KV (no v when k_eq_v)
  DevMatrix gate_up;  // gate, then up
  DevMatrix o, down, ple_gate, ple_proj;
  DeviceBuffer keys, values;  // own KV rows: [blocks of kind + 1, block, K·Dh] of the pool's
                              // row type; empty when shared
  DeviceBuffer inv_freq;
  int64_t rotary_dim = 0;
  float rope_scaling = 1.f;
  float scalar = 1.f;
  bool prefill_kernel = false;  // attention_prefill takes this layer's head dim here
};

// The projections a layer's fused qkv matrix holds, in order.
std::vector<const WeightMatrix*> qkv_parts(const LayerSpec& ls, const LayerWeights& lw,
                                           bool own_kv) {
  std::vector<const WeightMatrix*> parts = {&lw.q};
  if (own_kv) parts.push_back(&lw.k);
  if (own_kv && !ls.k_eq_v) parts.push_back(&lw.v);
  return parts;
}

}  // namespace

struct Decoder::Impl {
  const Model& model;
  const ModelSpec& spec;
  KvPool& kv_pool;
  const bool kv_bf16;  // the pool's rows are bf16 (else f32)
  int64_t max_tokens;
  int device = 0;
  std::string name;
  int multiprocessors = 1;
  int64_t min_kv_heads = 1;  // over the layers: sizes the split partials
  bool graphs = graphs_enabled_by_env();
  const bool bf16_gemm_inputs;  // GemmInputs::Bf16, else hi/lo halves
  int64_t gemv_tokens = Decoder::gemv_max_tokens();
  // Steps of at most this many tokens launch with programmatic dependent
  // launch (runtime.h; TANDEM_CUDA_PDL_MAX_TOKENS, TANDEM_CUDA_PDL=0/1
  // overrides). Measured on the H100 (session 27, context 1,024, tok/s,
  // off -> on): 4 / 8 / 16 sequences llama-3.2-1b 2,821 -> 3,125 / 5,337 ->
  // 5,740 / 10,222 -> 10,992, qwen3-1.7b +10% / +9% / +4%, ministral-3-3b
  // +4% / +4% / +4%, gemma-3-1b 2,394 -> 2,774 / 4,667 -> 5,397 / 8,652 ->
  // 9,594, gemma-4-e2b +12% / +10% / +11%; at 32 llama +1.7%, qwen3 +2.7%,
  // ministral +2.1%, gemma-4 +3.4%, gemma-3-1b -1.6% (15,938 -> 15,673).
  // Until then only GEMV steps (2 tokens) took it, after a -2% at 32 on the
  // H200 in the tenth session's kernels.
  const int64_t pdl_tokens = env_count("TANDEM_CUDA_PDL_MAX_TOKENS", 32);
  int64_t affine_gemv_tokens = Decoder::affine_gemv_max_tokens();
  // bf16 GEMMs of up to this many tokens (under bf16 GEMM inputs) take
  // skinny_gemm_bf16 instead of cuBLAS (TANDEM_CUDA_SKINNY_MAX_TOKENS, at
  // most kSkinnyGemmMaxTokens; 0: cuBLAS always). Measured on the H200
  // against cuBLAS (context 1,024): +3-7% at 4 and 8 sequences, +1.4% at 16
  // (llama-3.2-1b, ministral-3-3b); at 32 (twenty-first session) 11-21%
  // behind on every shape (gemma-3-1b 16,513 -> 12,992 tok/s).
  const int64_t skinny_tokens = env_count("TANDEM_CUDA_SKINNY_MAX_TOKENS", 16);
  // Decode steps of up to kAffineMmaMaxTokens past the GEMV over packed
  // 4-bit matrices run the int8 tensor-core GEMM (gemm_affine_int8, the
  // GEMV's numerics) unless TANDEM_CUDA_AFFINE_MMA=0 (bf16 tiles, below).
  // Measured on the H100 (twenty-second session) against the tiles:
  // llama-3.2-1b q4 at 16 / 32 sequences 3,599 -> 8,351 / 6,999 -> 11,748
  // tok/s, gemma-4-e2b 1,731 -> 3,537 / 2,725 -> 5,204; every shape 1.5-2.3x.
  const bool affine_mma = !env_is("TANDEM_CUDA_AFFINE_MMA", "0");
  // One-warp decode attention blocks split no further than one wave of the
  // blocks an SM holds (splits_for in attention_step) unless
  // TANDEM_DECODE_ONE_WAVE=0 (for measuring).
  const bool one_wave_splits = !env_is("TANDEM_DECODE_ONE_WAVE", "0");
  // Other steps past the GEMV over packed affine matrices dequantize them
  // to bf16 in tiles of at most this many weights (TANDEM_CUDA_DEQUANT_TILE_WEIGHTS;
  // default and most: the tile buffer's 32M), each tile then read by the
  // GEMM. Meant for measuring whether tiles small enough to stay in L2 (16
  // MB at 8M weights) spare the bf16 round trip through HBM. Steps of more
  // than 256 tokens (prefill) keep the whole buffer.
  const int64_t decode_dequant_tile =
      std::max<int64_t>(1, env_count("TANDEM_CUDA_DEQUANT_TILE_WEIGHTS", int64_t(32) << 20));
  // Steps of at most this many tokens take every layer projection as a GEMV,
  // so they fuse norms, residual adds and the gated activation into them
  // (0: never; see fused_step).
  int64_t fuse_tokens = 0;
  // No sandwich norms, per-layer inputs or layer scalars (llama, qwen,
  // ministral): the residual add and the next input norm move into the
  // projections around them; else only the gated activation does.
  bool plain_residual = false;
  // Sandwich norms on every layer (Gemma), q/k/v and gate/up bf16 or packed
  // (gemv_affine_pre_add_fits), cols % 8 == 0: steps of up to
  // kGemvPreAddMaxRows tokens defer each
  // block's output norm + residual add into the next projection
  // (GemvFusion::pre_add), the residual stream alternating between h and
  // h_alt (hcur is the live one).
  bool sandwich = false;
  // Gemma 4 under sandwich steps: the per-layer block fused
  // (ple_fusion_enabled).
  bool fuse_ple = false;
  // With fuse_ple: the MLP's output norm and residual add ride in the
  // per-layer gate's GEMV too (GemvFusion::pre_add without normalize), on
  // steps where that gate is a GEMV (ple_gate_adds_mlp_out), saving a
  // residual_norm launch a layer — over packed gate weights, whose quantize
  // kernel builds h' where it would have quantized h. Over bf16 the GEMV's
  // staging prologue costs more than the launch. Measured on the H100
  // (session 40, gemma-4-e2b, context 128, tok/s, two machines, off -> on):
  // 4-bit batch 1 661.5 / 662.0 -> 673.3 / 673.1 and 664.0 / 661.4 -> 675.5
  // / 676.8, batch 2 1,044 / 1,060 -> 1,077 / 1,068; bf16 batch 1 397.5 /
  // 398.2 -> 395.4 / 396.8, batch 2 698.5 / 698.6 -> 689.5 / 690.4.
  // TANDEM_CUDA_PLE_GATE_PRE_ADD (read when the decoder is made): 0 never,
  // 1 over bf16 gates too, else (default, "packed") packed gates only.
  bool ple_gate_pre_add = false;
  // Gemma 4's per-layer block on steps of bf16 GEMMs (twins) and of fused
  // GEMVs short of the sandwich: its glue rides in the kernels beside it
  // (per_layer_block) unless TANDEM_CUDA_PLE_TWINS=0 (read when the decoder
  // is made: for measuring and for the test that compares both).
  const bool ple_twins = !env_is("TANDEM_CUDA_PLE_TWINS", "0");
  float* hcur = nullptr;
  float* hnext = nullptr;
  // Query tiles of this step for attention_prefill (0: the decode kernel
  // for every token), after decode_prefix tokens that take the decode
  // kernel (plan_prefill_attention).
  int64_t prefill_tiles = 0, decode_prefix = 0;
  // The most keys a token of this step attends, rounded up to a power of
  // two (at least 64): caps the tensor-core decode kernel's splits, and is
  // part of a decode graph's key (a graph serves the contexts of its class).
  int64_t key_class = 64;
  // Every sequence of the step decodes one token (PagedAttention::one_new_key).
  bool one_token_per_sequence = false;
  // Steps whose projections are bf16 GEMMs (not fused GEMVs) under bf16
  // GEMM inputs: the kernels that produce a projection's input (the norms,
  // the gated activation, the attention kernels) also write it rounded to
  // bf16 in `twin`, which the projection right after reads instead of
  // launching split_bf16 (twin_out).
  bool twins = false;
  size_t weight_bytes = 0, streamed_bytes = 0, kv_bytes = 0;

  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  DeviceBuffer blas_workspace;
  // cuBLASLt algorithms chosen for the decode graphs' cuBLAS GEMMs
  // (gemm_tuning_enabled; null: cublasGemmEx's default everywhere).
  std::unique_ptr<GemmTuner> tuner;

  DevMatrix embed, head, ple_embed, ple_model_proj;
  bool head_tied = false;
  DeviceBuffer final_norm, ple_proj_norm;
  std::vector<Layer> layers;

  // Activations for max_tokens tokens.
  DeviceBuffer h, h_alt, x, qkv, q, attn, out, gate_up, gate, ple, ple_tmp, ple_gate, xb, twin,
      logits, partial;
  DeviceBuffer attn_codes;  // the attention output quantized for a 4-bit o GEMV (quantized_o)
  DeviceBuffer halves;   // [2, max_tokens, widest non-head projection] f32: the hi/lo GEMM output
  DeviceBuffer dequant;  // bf16 hi, then lo, rows of an affine matrix for prefill (empty: none)

  // The step's inputs: one pinned staging area, uploaded into `inputs`.
  // Offsets in bytes; the tables sections have room for every block of the
  // pool plus one padding entry per token.
  size_t off_ids = 0, off_ple_ids = 0, off_seq = 0, off_logit_rows = 0, off_image_rows = 0,
         off_pos = 0, off_key_end = 0, off_first_sliding = 0, off_start_full = 0,
         off_start_sliding = 0, off_samples = 0, off_tokens = 0, off_tiles = 0, off_tables_full = 0,
         off_tables_sliding = 0, inputs_bytes = 0;
  DeviceBuffer inputs;
  PinnedBuffer staging;
  DeviceBuffer image_rows;  // [max_tokens, D] image features of the step
  PinnedBuffer image_staging;
  int32_t scratch_block[2] = {0, 0};  // per kind: the padding block's id
  // Device sampling: the penalty list (grown on demand) and the ids out.
  DeviceBuffer penalties;
  PinnedBuffer penalty_staging;
  size_t penalty_capacity = 0;
  PinnedBuffer tokens_out;

  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> decode_graphs;  // (bucket, key_class)

  Impl(const Model& m, KvPool& pool, int64_t max_step_tokens, int dev, GemmInputs gemm_inputs)
      : model(m),
        spec(m.spec),
        kv_pool(pool),
        kv_bf16(pool.row_dtype() == DType::BF16),
        max_tokens(max_step_tokens),
        device(dev),
        bf16_gemm_inputs(gemm_inputs == GemmInputs::Bf16) {}

  ~Impl() {
    for (auto& [b, g] : decode_graphs) cudaGraphExecDestroy(g);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    tuner.reset();
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  template <class T>
  T* dev(size_t off) const {
    return reinterpret_cast<T*>(inputs.as<uint8_t>() + off);
  }
  template <class T>
  T* host(size_t off) const {
    return reinterpret_cast<T*>(staging.as<uint8_t>() + off);
  }

  StepLayout layout(AttentionKind kind) const {
    StepLayout at;
    at.positions = dev<int64_t>(off_pos);
    at.key_end = dev<int64_t>(off_key_end);
    at.seq = dev<int32_t>(off_seq);
    if (kind == AttentionKind::Full) {
      at.tables = dev<int32_t>(off_tables_full);
      at.table_start = dev<int32_t>(off_start_full);
    } else {
      at.tables = dev<int32_t>(off_tables_sliding);
      at.table_start = dev<int32_t>(off_start_sliding);
      at.first_block = dev<int64_t>(off_first_sliding);
    }
    return at;
  }

  // Profiling (profile_step): an event after every op, named by the op.
  struct Mark {
    const char* op;
    size_t bytes;  // weight bytes the op streams
  };
  bool profiling = false, capturing = false;
  // Ops a benchmark asked to leave out (Decoder::leave_out): names, matched
  // by substring.
  std::vector<std::string> left_out;
  bool leaves_out(const char* op) const {
    for (const std::string& name : left_out)
      if (std::strstr(op, name.c_str())) return true;
    return false;
  }
  cudaGraphExec_t profiled_graph = nullptr;  // a step's one-off graph with event nodes
  std::vector<Mark> marks;
  std::vector<cudaEvent_t> events;
  void mark(const char* op, size_t bytes = 0) {
    if (!profiling) return;
    if (events.size() <= marks.size()) {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
    // External (valid only inside a capture): the record becomes an event
    // node of the graph, so a replayed step is timed op by op too.
    CUDA_CHECK(cudaEventRecordWithFlags(events[marks.size()], stream,
                                        capturing ? cudaEventRecordExternal : 0));
    marks.push_back({op, bytes});
  }

  // The most tokens a step may have for `w` to run as a GEMV (else a GEMM).
  // Packed 4-bit matrices take the int8 tensor-core GEMM from 5 tokens on
  // (when on): measured on the H100 against the GEMV (tok/s, q4), at 4
  // tokens llama-3.2-1b 3,500 GEMV / 2,621 GEMM, ministral-3-3b 1,627 /
  // 1,129, gemma-3-1b 2,312 / 2,253; at 8 llama 4,482 / 4,746, ministral
  // 1,769 / 1,955, gemma-3-1b 3,102 / 4,293, gemma-4-e2b 1,708 / 2,018. The
  // GEMM fed through shared memory (twenty-third session) still loses at 4:
  // llama 3,481 / 1,130, ministral 1,621 / 1,315.
  int64_t gemv_limit(const DevMatrix& w) const {
    if (!w.affine) return gemv_tokens;
    return affine_mma && w.bits == 4 ? std::min<int64_t>(affine_gemv_tokens, 4)
                                     : affine_gemv_tokens;
  }
  bool gemv_path(const DevMatrix& w, int64_t n) const { return n <= gemv_limit(w); }

  // Where this step's input producers write the bf16 twin (null: nowhere).
  uint16_t* twin_out() { return twins ? twin.as<uint16_t>() : nullptr; }

  // Whether this step's gate/up projection of layer L runs as the skinny
  // GEMM with the activation in its epilogue (skinny_gemm_gated_bf16): bf16
  // weights without bias against the twin's bf16 rows, at a width the
  // skinny GEMM takes, unless TANDEM_CUDA_SKINNY_GATED=0 (for measuring it
  // against the GEMM and activation kernels). Measured on the H200 (context
  // 1,024, tok/s, separate kernels → gated GEMM): 8 sequences llama-3.2-1b
  // 6,281 → 6,416, ministral-3-3b 2,755 → 2,819, qwen3-1.7b 3,736 → 3,817,
  // gemma-3-1b 4,786 → 4,867, gemma-4-e2b 2,348 → 2,373; llama at 4 / 16
  // sequences 3,287 → 3,373 / 11,836 → 11,976.
  bool gated_gemm(const Layer& L, int64_t T) const {
    static const bool enabled = !env_is("TANDEM_CUDA_SKINNY_GATED", "0");
    const DevMatrix& w = L.gate_up;
    return enabled && twins && !gemv_path(w, T) && !w.affine && w.dtype == DType::BF16 &&
           L.gate_up_bias.bytes() == 0 &&
           takes_skinny(w.buf.as<uint16_t>(), w.rows, w.cols, twin.as<uint16_t>(), T) &&
           xb.bytes() >= size_t(T * (w.rows / 2)) * sizeof(uint16_t);
  }

  // Row groups a block of the skinny GEMM takes over a matrix of `rows`
  // (gated: gate/up rows): kSkinnyRowGroups where TANDEM_CUDA_SKINNY_ROW_GROUPS
  // =4 and the matrix has that many 16-row groups (8 pairs) per SM or more
  // (gate/up, the head), else 1. Opt-in: meant to let the skinny GEMM take
  // 17-32-token steps over large matrices, where it lost to cuBLAS on L2
  // traffic (TANDEM_CUDA_SKINNY_MAX_TOKENS=32).
  // With TANDEM_CUDA_SKINNY_ROW_GROUPS=fit, only where the step's
  // activations (n tokens of `cols` bf16 values) fit 64 KB of L1. Measured
  // on the H100 (session 22, "4"): gemma-3-1b at 16 sequences 8,728 ->
  // 9,119 tok/s, ministral-3-3b (3,072-9,216 columns) 3,917 -> 3,705, the
  // rest within 1%; at 32 tokens still behind cuBLAS.
  int skinny_row_groups(int64_t rows, bool gated, int64_t n, int64_t cols) const {
    static const bool always = env_is("TANDEM_CUDA_SKINNY_ROW_GROUPS", "4");
    static const bool fit = env_is("TANDEM_CUDA_SKINNY_ROW_GROUPS", "fit");
    const int64_t groups = skinny_units(rows, gated);
    const bool wanted = always || (fit && n * cols * 2 <= 64 * 1024);
    return wanted && groups >= int64_t(kSkinnyRowGroups) * multiprocessors ? kSkinnyRowGroups : 1;
  }

  // The skinny GEMM's block layout over a matrix of `rows` (gated: gate/up
  // rows) for n tokens: its row groups a block (skinny_row_groups) and, with
  // one, column splits over clusters of up to TANDEM_CUDA_SKINNY_SPLITS
  // blocks (default kSkinnyMaxColSplits; 1: none) for matrices too narrow to
  // fill the SMs (skinny_col_splits: the Gemmas' o and down projections).
  struct SkinnyLayout {
    int row_groups = 1, col_splits = 1;
  };
  SkinnyLayout skinny_layout(int64_t rows, bool gated, int64_t n, int64_t cols) const {
    static const int most = int(env_count("TANDEM_CUDA_SKINNY_SPLITS", kSkinnyMaxColSplits));
    const int groups = skinny_row_groups(rows, gated, n, cols);
    return {groups, groups == 1 ? skinny_col_splits(rows, cols, gated, most) : 1};
  }

  // Whether a bf16 GEMM of n tokens over bf16 activations runs as the
  // skinny GEMM (gemm_bf16, gated_gemm) rather than cuBLAS.
  // Also, past skinny_tokens (up to kSkinnyGemmMaxTokens), matrices of at
  // most TANDEM_CUDA_SKINNY_NARROW_ROWS rows (3,072; 0: none): cuBLAS's
  // tiles over so few output rows leave SMs idle. Measured on the H100
  // (session 27, 32 sequences, context 1,024, tok/s, none / 2,048 / 3,072):
  // gemma-3-1b 15,751 / 17,591 / 17,573, gemma-4-e2b 7,449 / 7,932 / 7,949,
  // qwen3-1.7b 8,839 / 9,238 / 9,230, llama-3.2-1b 17,408 / 17,733 /
  // 18,113, ministral-3-3b 6,680 / 6,730 / 6,636. Session 29 (after the
  // column splits and the residual norm's changes), 2,048 -> 3,072 at 17 /
  // 32 sequences: llama 10,551 -> 10,800 / 17,382 -> 17,674, ministral
  // (o and down: 3,072 rows) 4,073 -> 4,237 / 6,724 -> 6,810 (and +3.9 /
  // +3.5 / +2.1% at 17 / 24 / 32 in a second call), qwen3 +0.9 / +0.2%,
  // the Gemmas (no matrix of 2,049-3,072 rows) within 1%.
  bool takes_skinny(const uint16_t* w, int64_t m, int64_t cols, const uint16_t* x,
                    int64_t n) const {
    static const int64_t narrow_rows = env_count("TANDEM_CUDA_SKINNY_NARROW_ROWS", 3072);
    const bool narrow = m <= narrow_rows && n <= kSkinnyGemmMaxTokens;
    return (n <= skinny_tokens || narrow) && skinny_gemm_fits(w, m, cols, x, n);
  }

  // y[n, rows] = x[n, cols] · Wᵀ (+ bias), with `fusion` (GEMV steps only:
  // fused_step); `op` names it in profiles. xin_bf16: xin rounded to bf16
  // by the kernel that wrote it (twin_out), used by a dense bf16 GEMM under
  // bf16 GEMM inputs in place of a split_bf16 launch.
  void linear(const char* op, const DevMatrix& w, const DeviceBuffer& bias, const float* xin,
              int64_t n, float* y, GemvFusion fusion = {}, const uint16_t* xin_bf16 = nullptr) {
    if (leaves_out(op)) return;
    if (gemv_path(w, n)) {
      fusion.bias = ptr(bias);
      if (w.affine)
        gemv_affine(w.view(), xin, n, y, stream, fusion, xb.get(),
                    xb.bytes());  // xb: free on GEMV steps
      else if (w.dtype == DType::BF16)
        gemv_bf16(w.buf.as<uint16_t>(), w.rows, w.cols, xin, n, y, stream, fusion);
      else
        gemv_f32(w.buf.as<float>(), w.rows, w.cols, xin, n, y, stream, fusion);
      mark(op, w.bytes());
      return;
    }
    if (fusion.normalize || fusion.accumulate || fusion.gate != GemvGate::None || fusion.times ||
        fusion.pre_add)
      fail("CUDA decoder: %s of %lld tokens is not a GEMV and cannot fuse", op, (long long)n);
    if (w.affine && affine_mma && affine_mma_takes(w.view(), n)) {
      gemm_affine_int8(w.view(), xin, n, y, stream, xb.get(), xb.bytes());
    } else if (w.affine) {
      // Prefill: tiles of rows dequantized to bf16 hi + lo parts (a bf16
      // tile alone put Gemma 4's fixtures 0.5 x std off the f32 reference),
      // each through the bf16 GEMM over hi/lo activations, plus lo · x_hi.
      // With bf16 GEMM inputs: one bf16 tile against bf16 activations.
      uint16_t* hi = xb.as<uint16_t>();
      uint16_t* lo = bf16_gemm_inputs ? nullptr : hi + n * w.cols;
      split_bf16(xin, n * w.cols, hi, lo, stream);
      const int64_t half = int64_t(dequant.bytes() / 4);  // elements per part
      const int64_t tile = n <= 256 ? std::min(half, decode_dequant_tile) : half;
      const int64_t chunk = std::max<int64_t>(1, tile / w.cols);
      for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
        const int64_t m = std::min(chunk, w.rows - r0);
        uint16_t* w_hi = dequant.as<uint16_t>();
        uint16_t* w_lo = lo ? w_hi + half : nullptr;
        dequantize_affine_bf16(w.view(), r0, m, w_hi, w_lo, stream);
        gemm_bf16(w_hi, r0, m, w.rows, w.cols, hi, lo, n, y);
        if (lo) gemm_bf16_add(w_lo, r0, m, w.rows, w.cols, hi, n, y);
      }
      if (lo && halves_fit(n, w.rows)) add_halves(halves.as<float>(), n * w.rows, y, stream);
    } else {
      const float one = 1.f, zero = 0.f;
      // Row-major y[n, rows] is column-major yᵀ[rows, n] = W · xᵀ, with W
      // read as the transpose of its column-major [cols, rows] view.
      if (w.dtype == DType::BF16 && bf16_gemm_inputs && xin_bf16) {
        gemm_bf16(w.buf.get(), 0, w.rows, w.rows, w.cols, xin_bf16, nullptr, n, y);
      } else if (w.dtype == DType::BF16) {
        uint16_t* hi = xb.as<uint16_t>();
        uint16_t* lo = bf16_gemm_inputs ? nullptr : hi + n * w.cols;
        split_bf16(xin, n * w.cols, hi, lo, stream);
        gemm_bf16(w.buf.get(), 0, w.rows, w.rows, w.cols, hi, lo, n, y);
        if (lo && halves_fit(n, w.rows)) add_halves(halves.as<float>(), n * w.rows, y, stream);
      } else {
        CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(w.rows), int(n), int(w.cols),
                                 &one, w.buf.as<float>(), int(w.cols), xin, int(w.cols), &zero, y,
                                 int(w.rows)));
      }
    }
    if (bias.bytes()) add_bias(y, bias.as<float>(), n, w.rows, stream);
    mark(op, w.bytes());
  }

  // Rows [r0, r0 + m) of y[n, rows] from the bf16 rows `wrows` ([m, cols])
  // against activations split into bf16 hi and lo ([n, cols] each, back to
  // back: one [2n, cols] operand, so one GEMM reads the weights once). The
  // two halves of the output land in `halves` for add_halves — or, when it
  // cannot hold them (a head over many rows), two GEMMs accumulate into y.
  // With lo null (bf16 GEMM inputs), one GEMM over hi writes y.
  // Whether the hi and lo products of n rows by `rows` outputs fit in
  // `halves` (else the GEMMs accumulate into y directly).
  bool halves_fit(int64_t n, int64_t rows) const {
    return size_t(2 * n * rows) * sizeof(float) <= halves.bytes();
  }

  void gemm_bf16(const void* wrows, int64_t r0, int64_t m, int64_t rows, int64_t cols,
                 const uint16_t* hi, const uint16_t* lo, int64_t n, float* y) {
    const float one = 1.f, zero = 0.f;
    // Row-major y[n, rows] is column-major yᵀ[rows, n] = W · xᵀ, with W read
    // as the transpose of its column-major [cols, m] view.
    if (!lo) {
      const auto* w16 = static_cast<const uint16_t*>(wrows);
      if (takes_skinny(w16, m, cols, hi, n)) {
        const SkinnyLayout blocks = skinny_layout(m, false, n, cols);
        skinny_gemm_bf16(w16, m, cols, hi, n, y + r0, rows, stream, blocks.row_groups,
                         blocks.col_splits);
        return;
      }
      // Decode graphs only: prefill's GEMMs keep the default.
      if (tuner && capturing && r0 == 0 && m == rows && tuner->gemm(wrows, m, cols, hi, n, y))
        return;
      CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(cols), &one,
                                wrows, CUDA_R_16BF, int(cols), hi, CUDA_R_16BF, int(cols), &zero,
                                y + r0, CUDA_R_32F, int(rows), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
      return;
    }
    if (halves_fit(n, rows)) {
      CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(2 * n), int(cols), &one,
                                wrows, CUDA_R_16BF, int(cols), hi, CUDA_R_16BF, int(cols), &zero,
                                halves.as<float>() + r0, CUDA_R_32F, int(rows), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
      return;
    }
    for (int part = 0; part < 2; ++part)
      CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(cols), &one,
                                wrows, CUDA_R_16BF, int(cols), part == 0 ? hi : lo, CUDA_R_16BF,
                                int(cols), part == 0 ? &zero : &one, y + r0, CUDA_R_32F, int(rows),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // The lo-weights term of an affine prefill GEMM, added where gemm_bf16
  // put its result (the hi half of `halves`, or y).
  void gemm_bf16_add(const void* wrows, int64_t r0, int64_t m, int64_t rows, int64_t cols,
                     const uint16_t* hi, int64_t n, float* y) {
    const float one = 1.f;
    float* dst = halves_fit(n, rows) ? halves.as<float>() : y;
    CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(cols), &one,
                              wrows, CUDA_R_16BF, int(cols), hi, CUDA_R_16BF, int(cols), &one,
                              dst + r0, CUDA_R_32F, int(rows), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }

  void embed_tokens(const DevMatrix& table, const int32_t* ids, int64_t T, float scale,
                    float* dst) {
    if (table.affine)
      embed_rows_affine(table.view(), ids, T, scale, dst, stream);
    else if (table.dtype == DType::BF16)
      embed_rows_bf16(table.buf.as<uint16_t>(), table.cols, ids, T, scale, dst, stream);
    else
      embed_rows_f32(table.buf.as<float>(), table.cols, ids, T, scale, dst, stream);
  }

  // The forward pass of T tokens whose inputs are in `inputs` (n_images of
  // them replaced by image rows), leaving the softcapped logits of the R
  // rows listed at off_logit_rows in `logits`. Only kernel launches and
  // device-side copies: capturable.
  void forward(int64_t T, int64_t R, int64_t n_images) {
    PdlScope pdl(T <= pdl_tokens);
    const ModelSpec& s = spec;
    const int64_t D = s.hidden, V = s.vocab;
    const Fuse fuse = fused_step(T);
    twins = bf16_gemm_inputs && fuse == Fuse::None;
    hcur = h.as<float>();
    hnext = fuse == Fuse::Sandwich ? h_alt.as<float>() : nullptr;
    float* hp = hcur;
    float* xp = x.as<float>();
    if (profiling) {
      if (!capturing) device_sleep(20'000'000, stream);  // the host queues the step meanwhile
      mark("start");
    }
    embed_tokens(embed, dev<int32_t>(off_ids), T, model.weights.embed_scale, hp);
    if (n_images > 0)
      scatter_rows(image_rows.as<float>(), dev<int32_t>(off_image_rows), n_images, D, hp, stream);
    mark("embed");
    if (s.ple_dim > 0) per_layer_inputs(T);
    // The MLP's residual add also computes the next layer's input norm when
    // nothing (per-layer inputs, a layer scalar) comes between them; under
    // Fuse::Sandwich it is deferred into the next layer's q/k/v GEMV instead
    // (`pending`: out holds layer l - 1's MLP output, or with fuse_ple its
    // per-layer block's, not yet added).
    bool x_ready = false;
    Pending pending;
    for (int64_t l = 0; l < s.layers; ++l) {
      attention_block(l, T, x_ready, pending, fuse);
      const float scalar = layers[size_t(l)].scalar;
      const bool next_direct = s.ple_dim == 0 && scalar == 1.0f && l + 1 < s.layers;
      x_ready = fuse != Fuse::Residual && fuse != Fuse::Sandwich && next_direct;
      pending = Pending{};
      if (fuse == Fuse::Sandwich && next_direct) pending.norm = &layers[size_t(l)].mlp_out_norm;
      // Gemma 4: the MLP's output may wait in `out` for the per-layer gate.
      const bool mlp_into_ple = s.ple_dim > 0 && ple_gate_adds_mlp_out(layers[size_t(l)], T, fuse);
      mlp_block(l, T, x_ready ? ptr(layers[size_t(l + 1)].attn_in_norm) : nullptr,
                pending.norm != nullptr || mlp_into_ple, fuse);
      if (s.ple_dim > 0) {
        const bool defer = fuse == Fuse::Sandwich && fuse_ple && l + 1 < s.layers;
        // Applies the layer scalar too; may leave the next layer's normed input in x.
        x_ready = per_layer_block(l, T, scalar, defer, fuse);
        if (defer) pending = Pending{&layers[size_t(l)].ple_out_norm, scalar};
      } else if (scalar != 1.0f) {
        scale_inplace(hcur, T * D, scalar, stream);
        mark("layer scalar");
      }
    }
    gather_rows(hcur, dev<int32_t>(off_logit_rows), R, D, xp, stream);
    rmsnorm(xp, ptr(final_norm), R, D, s.norm_eps, xp, stream, twin_out());
    mark("final norm");
    linear("head", head_tied ? embed : head, DeviceBuffer(), xp, R, logits.as<float>(), {},
           twin_out());
    if (s.final_softcap > 0.0f) softcap(logits.as<float>(), R * V, s.final_softcap, stream);
    mark("logit softcap");
  }

  // What a step of T tokens fuses into its projections (GemvFusion): None
  // (cuBLAS steps), Gate (the gated activation into gate/up), Residual
  // (also each block's input norm into its first projection and the
  // residual add into its last: plain_residual models), or Sandwich (the
  // gated activation, and each block's output norm + residual add + the
  // next input norm into the next block's first projection: `sandwich`).
  enum class Fuse { None, Gate, Residual, Sandwich };
  Fuse fused_step(int64_t T) const {
    if (T > fuse_tokens) return Fuse::None;
    if (plain_residual) return Fuse::Residual;
    return sandwich && T <= kGemvPreAddMaxRows ? Fuse::Sandwich : Fuse::Gate;
  }

  // Whether a fused step's gate/up GEMV quantizes its outputs for the down
  // projection in its own epilogue (GemvFusion::quantized_out: 4-bit
  // weights, steps of 1-2 tokens), so the down GEMV runs without a quantize
  // kernel before it; `gate` then holds the quantized rows (1.25 bytes a
  // column, within its f32 rows' size). TANDEM_CUDA_QUANTIZED_DOWN=0 turns
  // it off.
  bool quantized_down(const Layer& L, int64_t T) const {
    static const bool enabled = !env_is("TANDEM_CUDA_QUANTIZED_DOWN", "0");
    return enabled && L.gate_up.affine && L.down.affine && L.down.bits == 4 &&
           gemv_path(L.gate_up, T) && gemv_path(L.down, T) &&
           gemv_affine_quantized_out_fits(L.gate_up.view(), T) && L.down.cols == L.gate_up.rows / 2;
  }

  // Whether this step's attention kernels write the o projection's input
  // quantized (PagedAttention::out_quantized, into attn_codes) and the o
  // GEMV reads it as GemvFusion::quantized_in, so it runs without a
  // quantize kernel before it: 4-bit o weights on the GEMV path, steps of
  // up to kQuantizedOTokens tokens (decode steps: the prefill kernels do not
  // quantize), the tensor-core decode kernels (attention_quantizes_out).
  // TANDEM_CUDA_QUANTIZED_O=0 (read when the decoder is made) turns it off.
  static constexpr int64_t kQuantizedOTokens = 8;
  const bool quantized_o_enabled = !env_is("TANDEM_CUDA_QUANTIZED_O", "0");
  bool quantized_o(const Layer& L, int64_t T, const PagedAttention& p) const {
    return quantized_o_enabled && L.o.affine && L.o.bits == 4 && T <= kQuantizedOTokens &&
           attn_codes.bytes() >= size_t(T) * gemv_affine_quantized_row_bytes(L.o.cols) &&
           gemv_path(L.o, T) && L.o.cols == p.heads * p.head_dim && attention_quantizes_out(p);
  }

  // A block output deferred into the next projection (Fuse::Sandwich): out
  // holds it; the stream becomes (h + rmsnorm(out) · norm) · scale.
  struct Pending {
    const DeviceBuffer* norm = nullptr;  // null: nothing deferred
    float scale = 1.0f;
  };

  // The input norm of a block whose first projection reads the residual
  // stream itself (Fuse::Residual, Fuse::Sandwich). With `pre_norm`, the
  // stream is first advanced by rmsnorm(out) · pre_norm (the previous
  // block's deferred output), times pre_scale, written to hnext, which
  // becomes hcur.
  GemvFusion stream_input(const DeviceBuffer& norm, const DeviceBuffer* pre_norm,
                          float pre_scale = 1.0f) {
    GemvFusion f;
    f.normalize = true;
    f.norm_weight = ptr(norm);
    f.norm_eps = spec.norm_eps;
    if (pre_norm) {
      f.pre_add = out.as<float>();
      f.pre_add_weight = ptr(*pre_norm);
      f.residual_out = hnext;
      f.pre_add_scale = pre_scale;
    }
    return f;
  }
  void advance_stream() { std::swap(hcur, hnext); }

  // Gemma 4: ple[t, l] = (norm(proj(h) · D^-0.5)[l] + E_ple[id] · sqrt(P)) · 2^-0.5
  void per_layer_inputs(int64_t T) {
    const ModelSpec& s = spec;
    const int64_t P = s.ple_dim, LP = s.layers * P;
    float* pp = ple.as<float>();
    linear("ple model proj", ple_model_proj, DeviceBuffer(), hcur, T, pp);
    scale_inplace(pp, T * LP, 1.0f / std::sqrt(float(s.hidden)), stream);
    rmsnorm(pp, ptr(ple_proj_norm), T * s.layers, P, s.norm_eps, pp, stream);
    embed_tokens(ple_embed, dev<int32_t>(off_ple_ids), T, model.weights.ple_embed_scale,
                 ple_tmp.as<float>());
    add_then_scale(pp, ple_tmp.as<float>(), T * LP, 1.0f / std::sqrt(2.0f), stream);
    mark("ple inputs");
  }

  // x_ready: x already holds this layer's normed input. Fuse::Residual:
  // the qkv GEMV norms h itself and the o GEMV adds into h. Fuse::Sandwich:
  // the qkv GEMV norms h (after adding the previous layer's deferred
  // output, `pending`), and the o projection's output waits in `out` for
  // the gate/up GEMV.
  void attention_block(int64_t l, int64_t T, bool x_ready, const Pending& pending, Fuse fuse) {
    const ModelSpec& s = spec;
    const LayerSpec& ls = s.layer[size_t(l)];
    Layer& L = layers[size_t(l)];
    const int64_t D = s.hidden, Dh = ls.head_dim;
    float *hp = hcur, *xp = x.as<float>(), *qp = q.as<float>();
    if (fuse == Fuse::Residual || fuse == Fuse::Sandwich) {
      const DeviceBuffer* pre = pending.norm;
      linear(pre ? "qkv proj (+ residual, norm)" : "qkv proj (+ norm)", L.qkv, L.qkv_bias, hp, T,
             qkv.as<float>(), stream_input(L.attn_in_norm, pre, pending.scale));
      if (pre) advance_stream();
    } else {
      if (!x_ready) {
        rmsnorm(hp, ptr(L.attn_in_norm), T, D, s.norm_eps, xp, stream, twin_out());
        mark("attn norm");
      }
      // x and its twin: from the norm above, or the previous layer's
      // residual_norm (x_ready).
      linear("qkv proj", L.qkv, L.qkv_bias, xp, T, qkv.as<float>(), {}, twin_out());
    }
    const StepLayout at = layout(ls.kind);
    Layer& src = layers[size_t(ls.kv_source)];
    QkvPost post;
    post.heads = s.heads;
    post.kv_heads = ls.kv_heads;
    post.head_dim = Dh;
    post.stride = L.qkv.rows;
    post.own_kv = ls.kv_source == l;
    post.k_eq_v = ls.k_eq_v;
    post.qk_norm = s.qk_norm;
    post.v_norm = s.v_norm;
    post.q_norm = ptr(L.q_norm);
    post.k_norm = ptr(L.k_norm);
    post.eps = s.norm_eps;
    post.inv_freq = L.inv_freq.as<float>();
    post.rotary_dim = L.rotary_dim;
    post.rope_scaling = L.rope_scaling;
    post.temp_beta = s.query_temperature_beta;
    post.temp_base = float(std::max<int64_t>(1, s.query_temperature_base));
    post.q_out = qp;
    post.k_cache = src.keys.get();
    post.v_cache = src.values.get();
    post.kv_bf16 = kv_bf16;
    post.block_size = KvPool::kBlockSize;
    PagedAttention p;
    p.heads = s.heads;
    p.kv_heads = ls.kv_heads;
    p.head_dim = Dh;
    p.scale = s.attn_scale;
    p.softcap = s.attn_softcap;
    p.window = ls.kind == AttentionKind::Sliding ? s.sliding_window : 0;
    p.k_base = src.keys.get();
    p.v_base = src.values.get();
    p.kv_bf16 = kv_bf16;
    p.block_size = KvPool::kBlockSize;
    p.partial = partial.as<float>();
    p.bf16_inputs = bf16_gemm_inputs;  // the attention kernels' q and weights, as the GEMMs'
    p.multiprocessors = multiprocessors;
    p.one_new_key = one_token_per_sequence;
    p.out_bf16 = twin_out();  // the o projection's input, rounded by the attention kernels
    // Key-range splits for the decode kernel this layer takes: on CUDA
    // cores, enough 128-thread blocks for 2 per SM; on tensor cores, warps
    // for decode_blocks_per_sm() per SM — one-warp blocks (head dim 512)
    // or blocks of key warps that merge in shared memory (decode_key_warps).
    const bool mma = attention_decode_mma_supported(p);
    // The kernel is built for one key warp or its most (a cap in between
    // takes one: there is no launch of that shape).
    const int most_key_warps = mma ? attention_decode_key_warps(p) : 1;
    const int key_warps = decode_key_warps() >= most_key_warps ? most_key_warps : 1;
    const int64_t tile_keys = mma ? attention_decode_tile_keys(p) : 1;
    // The most keys a token of this step attends on this layer (a class).
    const int64_t keys = p.window > 0 ? std::min<int64_t>(key_class, p.window) : key_class;
    // One-warp blocks: each split keeps at least decode_min_split_keys()
    // of the keys the step can attend here (unless that leaves SMs without a
    // block), and there are at most one_warp_max_splits(keys) (each is one
    // more partial the combine kernel reads).
    // Where an SM holds fewer of these blocks than decode_blocks_per_sm()
    // aims for (dim 512: two), the splits stop at one wave of them: gemma-4-e2b's
    // global layers at 32 sequences ran 17 splits, 544 blocks in three waves
    // of 264 (ncu, H100: 66 us, 33% of the DRAM bandwidth).
    auto splits_for = [&](int64_t tokens) {
      if (!mma) return attention_splits(tokens, ls.kv_heads, multiprocessors);
      const int64_t units = tokens * ls.kv_heads;
      const int64_t floor = (multiprocessors + units - 1) / units;  // a block per SM
      const int64_t most = one_warp_max_splits(keys);
      const int64_t cap =
          std::min(most, std::max({int64_t(1), keys / decode_min_split_keys(), floor}));
      const int resident = attention_decode_one_warp_blocks_per_sm(p);
      if (one_wave_splits && resident < decode_blocks_per_sm()) {
        const int64_t wave = std::max<int64_t>(1, int64_t(resident) * multiprocessors / units);
        return int(std::min(cap, wave));
      }
      return int(std::min<int64_t>(
          cap, attention_splits(tokens, ls.kv_heads, multiprocessors, decode_blocks_per_sm())));
    };
    // Key warps: one block per (token, kv head) when each warp then keeps at
    // most decode_warp_keys(); else as many warps as attention_splits gives
    // one-warp blocks, each keeping at least one tile (no fewest-keys rule:
    // a block's warps merge without the combine kernel), in blocks of
    // key_warps. Measured on the H200 against the one-warp rule in blocks of
    // key warps: llama-3.2-1b batch 1 at context 1024 959 → 993 tok/s,
    // qwen3-1.7b 614 → 625, gemma-3-1b 757 → 748; 32 sequences gemma-3-1b
    // 13,922 → 14,027, gemma-4-e2b 6,619 → 6,525, llama equal.
    const bool chunked =
        mma && Dh >= decode_chunked_min_dim() && attention_decode_chunked_supported(p);
    // quantized_out: the attention also writes the o projection's 4-bit input.
    auto plan_keys = [&](int64_t tokens, bool quantized_out) {
      const int64_t units = tokens * ls.kv_heads;
      const int64_t most = std::clamp<int64_t>(multiprocessors / units, 1, kChunkedMaxSplits);
      const int64_t want = (keys + decode_chunked_split_keys() - 1) / decode_chunked_split_keys();
      p.chunked = chunked && units <= decode_chunked_units(Dh) && (Dh >= 256 || want <= most);
      p.merge_in_cluster = false;
      if (p.chunked) {
        p.key_warps = 1;
        p.splits = int(std::clamp<int64_t>(want, 1, most));
        p.merge_in_cluster = cluster_merge_enabled(units, quantized_out) && p.splits > 1 &&
                             p.splits <= attention_decode_cluster_max_splits(Dh);
        return;
      }
      p.key_warps = key_warps;
      if (key_warps == 1) {
        p.splits = splits_for(tokens);
        return;
      }
      if (keys <= key_warps * decode_warp_keys(tile_keys)) {
        p.splits = 1;
        return;
      }
      const int64_t warps = std::min<int64_t>(
          (keys + tile_keys - 1) / tile_keys,
          attention_splits(tokens, ls.kv_heads, multiprocessors, decode_blocks_per_sm()));
      p.splits = int((warps + key_warps - 1) / key_warps);
    };
    // Decode steps on the chunked kernel may do qkv_post's work inside it
    // (fuses_qkv_post).
    const bool prefill_attention = prefill_tiles > 0 && L.prefill_kernel;
    const bool qo = !prefill_attention && !leaves_out("attention") && quantized_o(L, T, p);
    if (!prefill_attention) plan_keys(T, qo);
    if (qo) p.out_quantized = attn_codes.as<uint8_t>();
    const bool fuse_post = !prefill_attention && p.chunked && one_token_per_sequence &&
                           !leaves_out("qkv post") && !leaves_out("attention") &&
                           fuses_qkv_post(p, post);
    if (!fuse_post && !leaves_out("qkv post")) qkv_post(qkv.as<float>(), T, at, post, stream);
    mark("qkv post (norm, rope, kv write)");
    if (leaves_out("attention")) {
      // skipped (leave_out)
    } else if (fuse_post) {
      attention_paged(qkv.as<float>(), T, at, p, attn.as<float>(), stream, DecodeKernel::Auto,
                      &post);
    } else if (prefill_attention) {
      if (decode_prefix > 0) {
        plan_keys(decode_prefix, false);
        attention_paged(qp, decode_prefix, at, p, attn.as<float>(), stream);
      }
      attention_prefill(qp, at, dev<int32_t>(off_tiles), prefill_tiles, p, attn.as<float>(),
                        stream);
    } else {
      attention_paged(qp, T, at, p, attn.as<float>(), stream);
    }
    mark("attention");
    GemvFusion o_in;  // the attention's quantized rows, when it wrote them
    if (qo) o_in.quantized_in = p.out_quantized;
    if (fuse == Fuse::Residual) {
      GemvFusion add = o_in;
      add.accumulate = true;
      linear("o proj (+ residual)", L.o, L.o_bias, attn.as<float>(), T, hcur, add);
      return;
    }
    float* op = out.as<float>();
    linear("o proj", L.o, L.o_bias, attn.as<float>(), T, op, o_in, twin_out());
    if (fuse == Fuse::Sandwich) return;
    if (!leaves_out("residual + norm"))
      residual_norm(hcur, op, ptr(L.attn_out_norm), ptr(L.mlp_in_norm), xp, T, D, s.norm_eps,
                    stream, 1.f, twin_out());
    mark("residual + norm");
  }

  // Expects x = the MLP's normed input (attention_block leaves it), except
  // under Fuse::Residual (gate/up norms h itself, down adds into h) and
  // Fuse::Sandwich (gate/up adds the attention output to h and norms it);
  // next_norm: also leave the next layer's normed input in x; defer (only
  // Fuse::Sandwich): leave the MLP's output in `out` for the next layer.
  void mlp_block(int64_t l, int64_t T, const float* next_norm, bool defer, Fuse fuse) {
    const ModelSpec& s = spec;
    Layer& L = layers[size_t(l)];
    const int64_t D = s.hidden, F = s.layer[size_t(l)].intermediate;
    float *xp = x.as<float>(), *op = out.as<float>();
    // The down projection's bf16 input: the activation's twin, unless the
    // gated GEMM below put it elsewhere.
    const uint16_t* gate_bf16 = twin_out();
    // The gate/up GEMV leaves the down projection's activations quantized in
    // `gate`, not the f32 rows (quantized_down).
    const bool qdown = fuse != Fuse::None && quantized_down(L, T);
    if (fuse != Fuse::None) {
      const bool from_stream = fuse == Fuse::Residual || fuse == Fuse::Sandwich;
      GemvFusion f;
      if (from_stream)
        f = stream_input(L.mlp_in_norm, fuse == Fuse::Sandwich ? &L.attn_out_norm : nullptr);
      f.gate = s.activation == Activation::SiLU ? GemvGate::SiLU : GemvGate::GeluTanh;
      if (qdown) f.quantized_out = gate.as<uint8_t>();
      linear(fuse == Fuse::Sandwich   ? "gate/up proj (+ residual, norm, activation)"
             : fuse == Fuse::Residual ? "gate/up proj (+ norm, activation)"
                                      : "gate/up proj (+ activation)",
             L.gate_up, L.gate_up_bias, from_stream ? hcur : xp, T, gate.as<float>(), f);
      if (fuse == Fuse::Sandwich) advance_stream();
    } else if (gated_gemm(L, T)) {
      // The activation in the GEMM's epilogue; its bf16 copy goes to xb,
      // since the twin holds the x it reads.
      if (!leaves_out("gate/up proj (+ activation)")) {
        const SkinnyLayout blocks = skinny_layout(L.gate_up.rows, true, T, L.gate_up.cols);
        skinny_gemm_gated_bf16(
            L.gate_up.buf.as<uint16_t>(), L.gate_up.rows / 2, L.gate_up.cols, twin_out(), T,
            s.activation == Activation::SiLU ? GemvGate::SiLU : GemvGate::GeluTanh,
            gate.as<float>(), xb.as<uint16_t>(), stream, blocks.row_groups, blocks.col_splits);
      }
      mark("gate/up proj (+ activation)", L.gate_up.bytes());
      gate_bf16 = xb.as<uint16_t>();
    } else {
      linear("gate/up proj", L.gate_up, L.gate_up_bias, xp, T, gate_up.as<float>(), {}, twin_out());
      if (s.activation == Activation::SiLU)
        silu_mul_halves(gate_up.as<float>(), T, F, gate.as<float>(), stream, twin_out());
      else
        gelu_tanh_mul_halves(gate_up.as<float>(), T, F, gate.as<float>(), stream, twin_out());
      mark("gated activation");
    }
    float* hp = hcur;
    GemvFusion down_in;
    if (qdown) down_in.quantized_in = gate.as<uint8_t>();
    if (fuse == Fuse::Residual) {
      GemvFusion add = down_in;
      add.accumulate = true;
      linear("down proj (+ residual)", L.down, L.down_bias, gate.as<float>(), T, hp, add);
      return;
    }
    // The gate's bf16 copy (gate_bf16): written on twin steps by the
    // activation kernel or the gated GEMM above (a fused step's gate comes
    // from the gate/up GEMV, and twin_out is null).
    linear("down proj", L.down, L.down_bias, gate.as<float>(), T, op, down_in, gate_bf16);
    if (defer) return;
    // Gemma 4 (ple_twin_step): the new h's bf16 copy in the twin, for the
    // per-layer gate's GEMM (no x comes out here: its block goes between).
    uint16_t* h_bf16 = !next_norm && ple_twin_step() ? twin_out() : nullptr;
    if (!leaves_out("residual + norm"))
      residual_norm(hp, op, ptr(L.mlp_out_norm), next_norm, next_norm ? xp : nullptr, T, D,
                    s.norm_eps, stream, 1.f, next_norm ? twin_out() : nullptr, h_bf16);
    mark("residual + norm");
  }

  // Gemma 4: h = (h + norm(proj(act(gate(h)) · ple[:, layer]))) · scalar
  // (the layer scalar, applied by the same residual_norm launch).
  // defer (fuse_ple, Fuse::Sandwich steps): leave proj's output in `out`
  // for the next layer's q/k/v GEMV, which adds its norm and applies the
  // scalar (Pending).
  // Where ple_gate_adds_mlp_out, `out` holds the MLP's output, not yet
  // normed and added to h; the gate GEMV does both (pre_add), writing the
  // new h to hnext, which becomes hcur.
  // Returns whether it left layer l + 1's normed input in x (and its twin):
  // with ple_twins, on steps whose attention block takes x (Fuse::None and
  // Fuse::Gate), its residual add also computes that norm, and on twin steps
  // its GEMMs read bf16 copies that the kernels before them wrote (h's by
  // the MLP's residual add, the gated activation's by that kernel) instead
  // of a split_bf16 launch each.
  bool per_layer_block(int64_t l, int64_t T, float scalar, bool defer, Fuse fuse) {
    const ModelSpec& s = spec;
    Layer& L = layers[size_t(l)];
    const bool mlp_pending = ple_gate_adds_mlp_out(L, T, fuse);
    const int64_t D = s.hidden, P = s.ple_dim, LP = s.layers * P;
    float *gp = ple_gate.as<float>(), *op = out.as<float>(), *xp = x.as<float>();
    const bool twin_inputs = ple_twin_step();
    // The activation's bf16 copy: in xb, which no GEMM with a twin input
    // touches (the twin holds h's).
    uint16_t* gate_bf16 = twin_inputs ? xb.as<uint16_t>() : nullptr;
    const uint16_t* h_bf16 = twin_inputs ? twin_out() : nullptr;
    // Only the fused GEMV branch below takes the MLP's pending output.
    if (mlp_pending && (h_bf16 || !fuse_ple || !gemv_path(L.ple_gate, T)))
      fail("CUDA decoder: layer %lld's MLP output waits for a per-layer gate that is no GEMV",
           (long long)l);
    if (ple_gate_times(L, T, h_bf16)) {
      // The activation times the per-layer input in the skinny GEMM's epilogue.
      if (!leaves_out("ple gate (+ activation)")) {
        const SkinnyLayout blocks = skinny_layout(P, false, T, L.ple_gate.cols);
        skinny_gemm_times_bf16(
            L.ple_gate.buf.as<uint16_t>(), P, L.ple_gate.cols, h_bf16, T,
            s.activation == Activation::SiLU ? GemvGate::SiLU : GemvGate::GeluTanh,
            ple.as<float>() + l * P, LP, gp, gate_bf16, stream, blocks.row_groups,
            blocks.col_splits);
      }
      mark("ple gate (+ activation)", L.ple_gate.bytes());
    } else if (fuse_ple && gemv_path(L.ple_gate, T)) {
      // The activation times the per-layer input in the GEMV's epilogue.
      GemvFusion f;
      if (mlp_pending) {  // h + rmsnorm(out) · mlp_out_norm, not normed itself
        f.pre_add = op;
        f.pre_add_weight = ptr(L.mlp_out_norm);
        f.norm_eps = s.norm_eps;
        f.residual_out = hnext;
      }
      f.times = ple.as<float>() + l * P;
      f.times_stride = LP;
      f.times_act = s.activation == Activation::SiLU ? GemvGate::SiLU : GemvGate::GeluTanh;
      linear(mlp_pending ? "ple gate (+ residual, activation)" : "ple gate (+ activation)",
             L.ple_gate, DeviceBuffer(), hcur, T, gp, f);
      if (mlp_pending) advance_stream();
    } else {
      linear("ple gate", L.ple_gate, DeviceBuffer(), hcur, T, gp, {}, h_bf16);
      // The block's kernels go with it under leave_out("ple") (benchmarks).
      if (leaves_out("ple activation")) {
        // skipped (leave_out)
      } else if (s.activation == Activation::SiLU) {
        silu_mul_strided(gp, ple.as<float>() + l * P, LP, T, P, stream, gate_bf16);
      } else {
        gelu_tanh_mul_strided(gp, ple.as<float>() + l * P, LP, T, P, stream, gate_bf16);
      }
      mark("ple activation");
    }
    linear("ple proj", L.ple_proj, DeviceBuffer(), gp, T, op, {}, gate_bf16);
    if (defer) return false;
    const bool norm_next = ple_twins && l + 1 < s.layers &&
                           (fuse == Fuse::None || fuse == Fuse::Gate) &&
                           !leaves_out("ple norm + add");
    if (!leaves_out("ple norm + add"))
      residual_norm(hcur, op, ptr(L.ple_out_norm),
                    norm_next ? ptr(layers[size_t(l + 1)].attn_in_norm) : nullptr,
                    norm_next ? xp : nullptr, T, D, s.norm_eps, stream, scalar,
                    norm_next ? twin_out() : nullptr);
    mark(scalar != 1.0f ? "ple norm + add, layer scalar" : "ple norm + add");
    return norm_next;
  }

  // Whether layer L's MLP leaves its output in `out` for the per-layer
  // gate's GEMV to norm and add (ple_gate_pre_add): sandwich steps where
  // that gate is a GEMV (so per_layer_block takes its fused branch).
  bool ple_gate_adds_mlp_out(const Layer& L, int64_t T, Fuse fuse) const {
    return ple_gate_pre_add && fuse == Fuse::Sandwich && gemv_path(L.ple_gate, T);
  }

  // Whether this step's per-layer block reads bf16 twins (ple_twins): a
  // Gemma 4 step of bf16 GEMMs.
  bool ple_twin_step() const { return ple_twins && twins && spec.ple_dim > 0; }

  // Whether the per-layer gate of layer L runs as the skinny GEMM with its
  // activation and the per-layer input's product in the epilogue
  // (skinny_gemm_times_bf16) on this twin step, h_bf16 being h's twin:
  // bf16 weights without the GEMV path, where the skinny GEMM takes them,
  // unless TANDEM_CUDA_PLE_GATE_TIMES=0 (read when the decoder is made).
  const bool ple_gate_times_enabled = !env_is("TANDEM_CUDA_PLE_GATE_TIMES", "0");
  bool ple_gate_times(const Layer& L, int64_t T, const uint16_t* h_bf16) const {
    return ple_gate_times_enabled && h_bf16 && !L.ple_gate.affine &&
           L.ple_gate.dtype == DType::BF16 && !gemv_path(L.ple_gate, T) &&
           takes_skinny(L.ple_gate.buf.as<uint16_t>(), L.ple_gate.rows, L.ple_gate.cols, h_bf16, T);
  }

  // A decode graph for bucket B; with the tuner, the shapes its first
  // capture met for the first time are tuned (outside any capture) and the
  // step captured again with their algorithms.
  cudaGraphExec_t capture_decode(int64_t B) {
    cudaGraphExec_t exec = capture_decode_once(B);
    if (!tuner || !tuner->pending()) return exec;
    cudaGraphExecDestroy(exec);
    const auto t0 = std::chrono::steady_clock::now();
    const size_t shapes = tune_gemms();
    std::fprintf(stderr, "tandem: decode steps of %lld tokens: %zu GEMM shapes tuned in %.0f ms\n",
                 (long long)B, shapes, ms_since(t0));
    return capture_decode_once(B);
  }

  // The tuner's pending shapes tuned, each one's line logged when
  // gemm_tuning_verbose(); returns how many.
  size_t tune_gemms() {
    const std::vector<std::string> lines = tuner->tune();
    if (gemm_tuning_verbose())
      for (const std::string& line : lines)
        std::fprintf(stderr, "tandem: decode GEMM %s\n", line.c_str());
    return lines.size();
  }
  static double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  cudaGraphExec_t capture_decode_once(int64_t B) {
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    capturing = true;
    try {
      forward(B, B, 0);
    } catch (...) {
      capturing = false;
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    capturing = false;
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(e);
    return exec;
  }

  // The graph replayed for decode steps of bucket B at this step's key
  // class (captured once each); when profiling, a one-off capture with event
  // nodes, freed after the step.
  cudaGraphExec_t decode_graph(int64_t B) {
    if (profiling) return profiled_graph = capture_decode(B);
    const std::pair<int64_t, int64_t> key{B, key_class};
    auto it = decode_graphs.find(key);
    if (it != decode_graphs.end()) return it->second;
    return decode_graphs[key] = capture_decode(B);
  }
};

size_t Decoder::weight_bytes_for(const Model& model) {
  const ModelSpec& s = model.spec;
  const Weights& w = model.weights;
  auto vec = [](const Vec& v) { return v.size() * sizeof(float); };
  WeightMatrix embed = w.embed;
  embed.rows = s.vocab;
  embed.cols = s.hidden;
  auto one = [](const WeightMatrix& m) {
    return device_bytes(std::vector<const WeightMatrix*>{&m});
  };
  size_t total = one(embed) + vec(w.final_norm) + one(w.ple_embed) + one(w.ple_model_proj) +
                 vec(w.ple_proj_norm);
  if (w.head.data != w.embed.data) total += one(w.head);
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerSpec& ls = s.layer[size_t(l)];
    const LayerWeights& lw = w.layers[size_t(l)];
    total += device_bytes(qkv_parts(ls, lw, ls.kv_source == l)) + device_bytes({&lw.gate, &lw.up});
    for (const WeightMatrix* m : {&lw.o, &lw.down, &lw.ple_gate, &lw.ple_proj})
      total += device_bytes(std::vector<const WeightMatrix*>{m});
    for (const Vec* v : {&lw.attn_in_norm, &lw.q_bias, &lw.k_bias, &lw.v_bias, &lw.q_norm,
                         &lw.k_norm, &lw.o_bias, &lw.attn_out_norm, &lw.mlp_in_norm, &lw.gate_bias,
                         &lw.up_bias, &lw.down_bias, &lw.mlp_out_norm, &lw.ple_out_norm})
      total += vec(*v);
    total += vec(make_rope_table(s.rope_for(l), ls.head_dim).inv_freq);
  }
  return total;
}

Decoder::Decoder(const Model& model, KvPool& kv_pool, int64_t max_step_tokens, int device,
                 GemmInputs gemm_inputs) {
  const ModelSpec& s = model.spec;
  const Weights& w = model.weights;
  if (kv_pool.has_host_storage())
    fail("CUDA decoder: the KV pool must be created without host storage");
  if (max_step_tokens <= 0) fail("CUDA decoder: max_step_tokens must be positive");
  std::string why;
  const int count = device_count(&why);
  if (device < 0 || device >= count)
    fail("CUDA device %d is not available (%d usable%s%s)", device, count, why.empty() ? "" : ": ",
         why.c_str());
  CUDA_CHECK(cudaSetDevice(device));
  impl_ = std::make_unique<Impl>(model, kv_pool, max_step_tokens, device, gemm_inputs);
  Impl& m = *impl_;
  const DeviceInfo info = device_info(device);
  m.name = "cuda:" + std::to_string(device);
  m.multiprocessors = std::max(1, info.multiprocessors);
  for (int64_t l = 0; l < s.layers; ++l)
    if (s.layer[size_t(l)].head_dim > 512)
      fail("CUDA decoder: layer %lld has head_dim %lld; the attention kernel takes at most 512",
           (long long)l, (long long)s.layer[size_t(l)].head_dim);
  CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&m.blas));
  CUBLAS_CHECK(cublasSetStream(m.blas, m.stream));
  m.blas_workspace = DeviceBuffer(kBlasWorkspace);
  CUBLAS_CHECK(cublasSetWorkspace(m.blas, m.blas_workspace.get(), kBlasWorkspace));
  if (gemm_tuning_enabled())
    m.tuner = std::make_unique<GemmTuner>(m.blas, m.stream, m.blas_workspace.get(), kBlasWorkspace);

  // Weights.
  const auto t0 = std::chrono::steady_clock::now();
  size_t& total = m.weight_bytes;
  WeightMatrix embed = w.embed;
  embed.rows = s.vocab;
  embed.cols = s.hidden;
  m.embed = upload_matrix(embed, total);
  m.head_tied = w.head.data == w.embed.data;
  if (!m.head_tied) m.head = upload_matrix(w.head, total);
  m.final_norm = upload_vec(w.final_norm, total);
  if (s.ple_dim > 0) {
    m.ple_embed = upload_matrix(w.ple_embed, total);
    m.ple_model_proj = upload_matrix(w.ple_model_proj, total);
    m.ple_proj_norm = upload_vec(w.ple_proj_norm, total);
  }
  int64_t max_q = 0, max_qkv = 0, max_f = 0, max_cols = s.hidden, max_dh = 0;
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerSpec& ls = s.layer[size_t(l)];
    const LayerWeights& lw = w.layers[size_t(l)];
    Layer L;
    const bool own_kv = ls.kv_source == l;
    L.attn_in_norm = upload_vec(lw.attn_in_norm, total);
    L.q_norm = upload_vec(lw.q_norm, total);
    L.k_norm = upload_vec(lw.k_norm, total);
    L.o_bias = upload_vec(lw.o_bias, total);
    L.attn_out_norm = upload_vec(lw.attn_out_norm, total);
    L.mlp_in_norm = upload_vec(lw.mlp_in_norm, total);
    L.down_bias = upload_vec(lw.down_bias, total);
    L.mlp_out_norm = upload_vec(lw.mlp_out_norm, total);
    L.ple_out_norm = upload_vec(lw.ple_out_norm, total);
    const auto qkv = qkv_parts(ls, lw, own_kv);
    L.qkv = upload_matrix(qkv, total);
    std::vector<std::pair<const Vec*, int64_t>> qkv_bias = {{&lw.q_bias, lw.q.rows}};
    if (own_kv) qkv_bias.push_back({&lw.k_bias, lw.k.rows});
    if (own_kv && !ls.k_eq_v) qkv_bias.push_back({&lw.v_bias, lw.v.rows});
    L.qkv_bias = upload_biases(qkv_bias, total);
    L.gate_up = upload_matrix({&lw.gate, &lw.up}, total);
    L.gate_up_bias =
        upload_biases({{&lw.gate_bias, lw.gate.rows}, {&lw.up_bias, lw.up.rows}}, total);
    L.o = upload_matrix(lw.o, total);
    L.down = upload_matrix(lw.down, total);
    L.ple_gate = upload_matrix(lw.ple_gate, total);
    L.ple_proj = upload_matrix(lw.ple_proj, total);
    L.scalar = lw.scalar;
    L.prefill_kernel = prefill_kernel_enabled() && attention_prefill_supported(ls.head_dim, device);
    const RopeTable rope = make_rope_table(s.rope_for(l), ls.head_dim);
    L.inv_freq = upload_vec(rope.inv_freq, total);
    L.rotary_dim = rope.rotary_dim;
    L.rope_scaling = rope.attention_scaling;
    max_q = std::max(max_q, ls.q_dim(s.heads));
    max_qkv = std::max(max_qkv, L.qkv.rows);
    max_f = std::max(max_f, ls.intermediate);
    max_dh = std::max(max_dh, ls.head_dim);
    m.min_kv_heads = l == 0 ? ls.kv_heads : std::min(m.min_kv_heads, ls.kv_heads);
    max_cols = std::max({max_cols, ls.q_dim(s.heads), ls.intermediate});
    m.layers.push_back(std::move(L));
  }
  m.streamed_bytes = total - m.ple_embed.bytes() - (m.head_tied ? 0 : m.embed.bytes());
  if (gemv_fusion_enabled()) {
    m.fuse_tokens = max_step_tokens;
    m.plain_residual = s.ple_dim == 0;
    for (const Layer& L : m.layers) {
      for (const DevMatrix* w : {&L.qkv, &L.o, &L.gate_up, &L.down})
        m.fuse_tokens = std::min(m.fuse_tokens, m.gemv_limit(*w));
      m.plain_residual = m.plain_residual && !L.attn_out_norm.bytes() && !L.mlp_out_norm.bytes() &&
                         L.scalar == 1.0f;
    }
    // GemvFusion::pre_add on the two projections that read the residual
    // stream: gemv_bf16's vector kernel, or gemv_affine's quantize kernel
    // (unless TANDEM_CUDA_AFFINE_PRE_ADD=0, for measuring).
    static const bool affine_pre_add = !env_is("TANDEM_CUDA_AFFINE_PRE_ADD", "0");
    const auto takes_pre_add = [&](const DevMatrix& w) {
      return w.affine ? affine_pre_add && gemv_affine_pre_add_fits(w.cols)
                      : w.dtype == DType::BF16 && gemv_pre_add_fits(kGemvPreAddMaxRows, w.cols);
    };
    m.sandwich = !m.plain_residual && s.hidden % 8 == 0;
    for (const Layer& L : m.layers)
      m.sandwich = m.sandwich && L.attn_in_norm.bytes() && L.attn_out_norm.bytes() &&
                   L.mlp_in_norm.bytes() && L.mlp_out_norm.bytes() && takes_pre_add(L.qkv) &&
                   takes_pre_add(L.gate_up);
    m.fuse_ple = m.sandwich && s.ple_dim > 0 && ple_fusion_enabled();
    m.ple_gate_pre_add = m.fuse_ple && !env_is("TANDEM_CUDA_PLE_GATE_PRE_ADD", "0");
    const bool bf16_gates_too = env_is("TANDEM_CUDA_PLE_GATE_PRE_ADD", "1");
    for (const Layer& L : m.layers)
      m.ple_gate_pre_add =
          m.ple_gate_pre_add && takes_pre_add(L.ple_gate) && (L.ple_gate.affine || bf16_gates_too);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "tandem: %.2f GB of weights on %s (%s) in %.1f s\n", total / 1e9,
               m.name.c_str(), info.name.c_str(), secs);

  // KV storage under the pool's block ids, plus one padding block per kind.
  for (int k = 0; k < 2; ++k) m.scratch_block[k] = int32_t(kv_pool.total(AttentionKind(k)));
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerSpec& ls = s.layer[size_t(l)];
    if (ls.kv_source != l) continue;
    const size_t rows = size_t(kv_pool.total(ls.kind) + 1) * size_t(KvPool::kBlockSize);
    const size_t bytes = rows * size_t(ls.kv_dim()) * dtype_size(kv_pool.row_dtype());
    Layer& L = m.layers[size_t(l)];
    L.keys = DeviceBuffer(bytes);
    L.values = DeviceBuffer(bytes);
    CUDA_CHECK(cudaMemset(L.keys.get(), 0, bytes));
    CUDA_CHECK(cudaMemset(L.values.get(), 0, bytes));
    m.kv_bytes += 2 * bytes;
  }

  // Activations.
  const size_t T = size_t(max_step_tokens), D = size_t(s.hidden), V = size_t(s.vocab),
               LP = size_t(s.layers * s.ple_dim);
  for (DeviceBuffer* b : {&m.h, &m.x, &m.out}) *b = DeviceBuffer(T * D * 4);
  if (m.sandwich) m.h_alt = DeviceBuffer(T * D * 4);
  m.qkv = DeviceBuffer(T * size_t(max_qkv) * 4);
  m.q = DeviceBuffer(T * size_t(max_q) * 4);
  m.attn = DeviceBuffer(T * size_t(max_q) * 4);
  bool o_4bit = false;
  for (const Layer& L : m.layers) o_4bit = o_4bit || (L.o.affine && L.o.bits == 4);
  if (o_4bit)
    m.attn_codes = DeviceBuffer(std::min<size_t>(T, Impl::kQuantizedOTokens) *
                                gemv_affine_quantized_row_bytes(max_q));
  m.gate_up = DeviceBuffer(T * size_t(2 * max_f) * 4);
  m.gate = DeviceBuffer(T * size_t(max_f) * 4);
  if (LP > 0) {
    m.ple = DeviceBuffer(T * LP * 4);
    m.ple_tmp = DeviceBuffer(T * LP * 4);
    m.ple_gate = DeviceBuffer(T * size_t(s.ple_dim) * 4);
    max_cols = std::max<int64_t>(max_cols, s.ple_dim);
  }
  // hi and lo parts, or the packed kernels' quantized activations
  m.xb = DeviceBuffer(
      std::max(2 * T * size_t(max_cols) * 2, gemv_affine_scratch_bytes(4, int64_t(T), max_cols)));
  m.twin = DeviceBuffer(T * size_t(max_cols) * 2);
  int64_t max_rows = std::max<int64_t>(s.hidden, 2 * max_f);
  max_rows = std::max({max_rows, max_qkv, LP > 0 ? int64_t(LP) : int64_t(0)});
  m.halves = DeviceBuffer(2 * T * size_t(max_rows) * 4);
  // Prefill over affine matrices: bf16 tiles of up to 32M weights.
  int64_t dequant_elems = 0;
  auto need_tiles = [&](const DevMatrix& w) {
    if (!w.affine) return;
    const int64_t rows =
        std::min<int64_t>(w.rows, std::max<int64_t>(1, (int64_t(32) << 20) / w.cols));
    dequant_elems = std::max(dequant_elems, rows * w.cols);
  };
  need_tiles(m.head_tied ? m.embed : m.head);
  need_tiles(m.ple_model_proj);
  for (const Layer& L : m.layers)
    for (const DevMatrix* w : {&L.qkv, &L.gate_up, &L.o, &L.down, &L.ple_gate, &L.ple_proj})
      need_tiles(*w);
  if (dequant_elems > 0) m.dequant = DeviceBuffer(size_t(dequant_elems) * 2 * 2);
  m.logits = DeviceBuffer(T * V * 4);
  // attention_splits keeps T · kv_heads · splits below 2 · 8 · SMs (the
  // tensor-core kernel's blocks per SM), so the partials of T · heads ·
  // splits rows fit in heads / min_kv_heads times that.
  const int64_t max_group = s.heads / m.min_kv_heads;
  m.partial =
      DeviceBuffer(size_t(2 * kTensorCoreBlocksPerSm * m.multiprocessors * max_group + s.heads) *
                   size_t(max_dh + 2) * 4);

  // Step inputs.
  size_t off = 0;
  auto section = [&](size_t& at, size_t bytes) {
    at = off;
    off += (bytes + 63) / 64 * 64;
  };
  section(m.off_ids, T * 4);
  section(m.off_ple_ids, T * 4);
  section(m.off_seq, T * 4);
  section(m.off_logit_rows, T * 4);
  section(m.off_image_rows, T * 4);
  section(m.off_start_full, T * 4);
  section(m.off_start_sliding, T * 4);
  section(m.off_samples, T * sizeof(SampleRow));
  section(m.off_tokens, T * 4);
  section(m.off_tiles, 2 * T * 4);
  section(m.off_pos, T * 8);
  section(m.off_key_end, T * 8);
  section(m.off_first_sliding, T * 8);
  section(m.off_tables_full, (size_t(kv_pool.total(AttentionKind::Full)) + T) * 4);
  section(m.off_tables_sliding, (size_t(kv_pool.total(AttentionKind::Sliding)) + T) * 4);
  m.inputs_bytes = off;
  m.inputs = DeviceBuffer(off);
  m.staging = PinnedBuffer(off);
  m.image_rows = DeviceBuffer(T * D * 4);
  m.image_staging = PinnedBuffer(T * D * 4);
  m.tokens_out = PinnedBuffer(T * 4);
  CUDA_CHECK(cudaDeviceSynchronize());
}

Decoder::~Decoder() {
  if (impl_) cudaSetDevice(impl_->device);
}

const ModelSpec& Decoder::spec() const {
  return impl_->spec;
}
int64_t Decoder::max_step_tokens() const {
  return impl_->max_tokens;
}
KvPool& Decoder::kv_pool() {
  return impl_->kv_pool;
}
const char* Decoder::device_name() const {
  return impl_->name.c_str();
}
size_t Decoder::weight_bytes() const {
  return impl_->weight_bytes;
}
size_t Decoder::streamed_bytes() const {
  return impl_->streamed_bytes;
}
size_t Decoder::kv_bytes() const {
  return impl_->kv_bytes;
}
void Decoder::leave_out(std::vector<std::string> ops) {
  for (auto& [key, g] : impl_->decode_graphs) cudaGraphExecDestroy(g);
  impl_->decode_graphs.clear();
  impl_->left_out = std::move(ops);
}

void Decoder::set_graphs(bool on) {
  impl_->graphs = on;
}
// The sequence before (1.5x steps rounded up to 8 from 8: 16, 24, 40, 64,
// 96, 144) ran 32 sequences as 40 rows, past the skinny GEMM's 32 tokens;
// TANDEM_CUDA_GRAPH_BUCKETS=legacy keeps it, for measuring.
int64_t Decoder::graph_bucket(int64_t n, int64_t max_step_tokens) {
  static const bool legacy = env_is("TANDEM_CUDA_GRAPH_BUCKETS", "legacy");
  int64_t b = 1;
  while (b < n) {
    if (legacy)
      b = b < 8 ? b * 2 : (b + b / 2 + 7) / 8 * 8;
    else if (b < 16)
      b *= 2;
    else
      b = (b & (b - 1)) == 0 ? b + b / 2 : b / 3 * 4;  // p -> 1.5p -> 2p
  }
  return std::min(b, max_step_tokens);
}

int64_t Decoder::gemv_max_tokens() {
  return env_count("TANDEM_GEMV_MAX_TOKENS", 2);  // for measuring where the paths cross
}

int64_t Decoder::affine_gemv_max_tokens() {
  return env_count("TANDEM_AFFINE_GEMV_MAX_TOKENS", 8);
}

void Decoder::prepare(int64_t max_sequences) {
  Impl& m = *impl_;
  if (!m.tuner || !m.graphs) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    CUDA_CHECK(cudaSetDevice(m.device));
    // A decode-only step's settings (step()); the graphs are captured only
    // for the GEMMs they record, and dropped.
    m.one_token_per_sequence = early_keys_enabled();
    m.key_class = 64;
    m.prefill_tiles = m.decode_prefix = 0;
    int64_t last = 0;
    const int64_t most = std::min(max_sequences, m.max_tokens);
    for (int64_t n = m.skinny_tokens + 1; n <= most; ++n) {
      const int64_t B = graph_bucket(n, m.max_tokens);
      if (B == last) continue;
      last = B;
      cudaGraphExecDestroy(m.capture_decode_once(B));
    }
    const size_t shapes = m.tune_gemms();
    if (shapes > 0)
      std::fprintf(stderr,
                   "tandem: %zu decode GEMM shapes tuned for steps of up to %lld sequences in "
                   "%.0f ms\n",
                   shapes, (long long)most, Impl::ms_since(t0));
  } catch (const Error& e) {
    std::fprintf(stderr,
                 "tandem: warning: tuning the decode GEMMs ahead failed (%s); each bucket is "
                 "tuned at its first step instead\n",
                 e.what());
  }
}

bool Decoder::samples_on_device() const {
  return true;
}

std::vector<Decoder::OpTime> Decoder::profile_step(std::span<const SeqStep> batch) {
  Impl& m = *impl_;
  m.profiling = true;
  m.marks.clear();
  auto done = [&] {
    m.profiling = false;
    if (m.profiled_graph) cudaGraphExecDestroy(m.profiled_graph);
    m.profiled_graph = nullptr;
  };
  try {
    step(batch);
  } catch (...) {
    done();
    throw;
  }
  done();
  std::vector<OpTime> ops;
  for (size_t i = 1; i < m.marks.size(); ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, m.events[i - 1], m.events[i]));
    auto it = std::find_if(ops.begin(), ops.end(),
                           [&](const OpTime& o) { return o.op == m.marks[i].op; });
    if (it == ops.end()) it = ops.insert(ops.end(), OpTime{m.marks[i].op});
    it->ms += ms;
    it->bytes += m.marks[i].bytes;
    it->calls++;
  }
  return ops;
}

void Decoder::step(std::span<const SeqStep> batch) {
  Impl& m = *impl_;
  const ModelSpec& s = m.spec;
  const int64_t D = s.hidden, V = s.vocab;
  // Checks first (the CPU decoder's), so a bad step changes nothing.
  const int64_t tokens = check_step(s, batch, m.max_tokens, /*samples_on_device=*/true);
  bool decode_only = true;
  for (const SeqStep& q : batch)
    if (q.n != 1 || q.embeds) decode_only = false;
  if (batch.empty()) return;
  CUDA_CHECK(cudaSetDevice(m.device));

  // Decode steps replay a graph captured for a bucket of B >= tokens rows;
  // the padding rows decode token 0 at position 0 into the padding blocks.
  const bool graph = m.graphs && decode_only;
  m.one_token_per_sequence = decode_only && early_keys_enabled();
  const int64_t T = graph ? graph_bucket(tokens, m.max_tokens) : tokens;
  int32_t* ids = m.host<int32_t>(m.off_ids);
  int32_t* ple_ids = m.host<int32_t>(m.off_ple_ids);
  int32_t* seq = m.host<int32_t>(m.off_seq);
  int32_t* logit_rows = m.host<int32_t>(m.off_logit_rows);
  int32_t* image_idx = m.host<int32_t>(m.off_image_rows);
  int32_t* start_full = m.host<int32_t>(m.off_start_full);
  int32_t* start_sliding = m.host<int32_t>(m.off_start_sliding);
  int64_t* pos = m.host<int64_t>(m.off_pos);
  int64_t* key_end = m.host<int64_t>(m.off_key_end);
  int64_t* first_sliding = m.host<int64_t>(m.off_first_sliding);
  int32_t* tables_full = m.host<int32_t>(m.off_tables_full);
  int32_t* tables_sliding = m.host<int32_t>(m.off_tables_sliding);
  float* images = m.image_staging.as<float>();
  int64_t t = 0, R = 0, n_images = 0, n_full = 0, n_sliding = 0;
  for (size_t si = 0; si < batch.size(); ++si) {
    const SeqStep& q = batch[si];
    const SequenceKv& kv = *q.kv;
    start_full[si] = int32_t(n_full);
    std::copy(kv.full.begin(), kv.full.end(), tables_full + n_full);
    n_full += int64_t(kv.full.size());
    start_sliding[si] = int32_t(n_sliding);
    std::copy(kv.sliding.begin(), kv.sliding.end(), tables_sliding + n_sliding);
    n_sliding += int64_t(kv.sliding.size());
    first_sliding[si] = kv.sliding_first;
    for (int64_t i = 0; i < q.n; ++i, ++t) {
      const bool image = q.embeds && q.embeds[i];
      ids[t] = q.ids[i];
      int64_t pid = q.ids[i];
      if (image && s.pad_id >= 0) pid = s.pad_id;  // as the CPU decoder
      ple_ids[t] = int32_t(pid >= s.ple_vocab ? 0 : pid);
      seq[t] = int32_t(si);
      pos[t] = kv.length + i;
      key_end[t] = q.key_end ? q.key_end[i] : kv.length + i + 1;
      if (image) {
        std::memcpy(images + n_images * D, q.embeds[i], size_t(D) * sizeof(float));
        image_idx[n_images++] = int32_t(t);
      }
    }
    if ((q.logits || q.sampling) && !graph) {
      const int64_t first = q.logits && q.all_logits ? t - q.n : t - 1;
      for (int64_t r = first; r < t; ++r) logit_rows[R++] = int32_t(r);
    }
  }
  // The step's key class: the most keys any token attends, as a power of
  // two — only while a split cap uses it (otherwise one class, so decode
  // graphs are not captured again as contexts grow).
  m.key_class = 64;
  if (decode_min_split_keys() > 1) {
    const int64_t max_keys = *std::max_element(key_end, key_end + tokens);
    while (m.key_class < max_keys) m.key_class *= 2;
  }
  // Prefill attention's query tiles (eager steps with a run of tokens).
  m.prefill_tiles = m.decode_prefix = 0;
  int64_t longest_run = 0;
  for (const SeqStep& q : batch) longest_run = std::max(longest_run, q.n);
  if (!graph && longest_run >= kPrefillKernelMinRun) {
    const PrefillAttentionPlan plan = plan_prefill_attention(seq, tokens);
    std::copy(plan.tiles.begin(), plan.tiles.end(), m.host<int32_t>(m.off_tiles));
    m.prefill_tiles = int64_t(plan.tiles.size() / 2);
    m.decode_prefix = plan.decode_tokens;
  }
  if (graph) {  // padding rows, each its own sequence
    for (int64_t r = t; r < T; ++r) {
      ids[r] = 0;
      ple_ids[r] = 0;
      seq[r] = int32_t(r);
      pos[r] = 0;
      key_end[r] = 1;
      start_full[r] = int32_t(n_full);
      tables_full[n_full++] = m.scratch_block[int(AttentionKind::Full)];
      start_sliding[r] = int32_t(n_sliding);
      tables_sliding[n_sliding++] = m.scratch_block[int(AttentionKind::Sliding)];
      first_sliding[r] = 0;
    }
    for (int64_t r = 0; r < T; ++r) logit_rows[r] = int32_t(r);
    R = T;
  }
  // Sampled sequences: their logits row (rows follow the sequences' order)
  // and their penalty lists.
  SampleRow* samples = m.host<SampleRow>(m.off_samples);
  int64_t n_samples = 0, n_penalties = 0;
  for (const SeqStep& q : batch)
    n_penalties += q.sampling ? int64_t(q.sampling->penalties.size()) : 0;
  if (size_t(n_penalties) > m.penalty_capacity) {
    m.penalty_capacity = size_t(n_penalties) * 2;
    m.penalties = DeviceBuffer(m.penalty_capacity * sizeof(PenaltyToken));
    m.penalty_staging = PinnedBuffer(m.penalty_capacity * sizeof(PenaltyToken));
  }
  PenaltyToken* pen = m.penalty_staging.as<PenaltyToken>();
  {
    int64_t row = 0, k = 0;
    for (const SeqStep& q : batch) {
      const bool wants_row = q.logits || q.sampling || graph;
      if (q.sampling) {
        const SamplingParams& sp = q.sampling->params;
        SampleRow& r = samples[n_samples];
        r = SampleRow{};
        r.row = int32_t(row);
        r.temperature = sp.temperature;
        r.top_k = sp.top_k;
        r.top_p = sp.top_p;
        r.min_p = sp.min_p;
        r.repetition_penalty = sp.repetition_penalty;
        r.presence_penalty = sp.presence_penalty;
        r.frequency_penalty = sp.frequency_penalty;
        r.uniform = q.sampling->uniform;
        for (const TokenPenalty& tp : q.sampling->penalties)
          pen[k++] = PenaltyToken{int32_t(n_samples), tp.id, tp.count, tp.seen};
        ++n_samples;
      }
      if (wants_row) row += q.logits && q.all_logits && !graph ? q.n : 1;
    }
  }
  // Upload: the fixed sections whole, the tables as far as used.
  auto upload = [&](size_t from, size_t bytes) {
    if (bytes)
      CUDA_CHECK(cudaMemcpyAsync(m.inputs.as<uint8_t>() + from, m.staging.as<uint8_t>() + from,
                                 bytes, cudaMemcpyHostToDevice, m.stream));
  };
  upload(0, m.off_tables_full + size_t(n_full) * 4);
  upload(m.off_tables_sliding, size_t(n_sliding) * 4);
  if (n_images > 0) {
    CUDA_CHECK(cudaMemcpyAsync(m.image_rows.get(), images, size_t(n_images * D) * sizeof(float),
                               cudaMemcpyHostToDevice, m.stream));
  }
  if (n_penalties > 0)
    CUDA_CHECK(cudaMemcpyAsync(m.penalties.get(), pen, size_t(n_penalties) * sizeof(PenaltyToken),
                               cudaMemcpyHostToDevice, m.stream));
  if (graph)
    CUDA_CHECK(cudaGraphLaunch(m.decode_graph(T), m.stream));
  else
    m.forward(T, R, n_images);
  if (n_samples > 0) {
    sample_rows(m.logits.as<float>(), n_samples, V, m.dev<SampleRow>(m.off_samples),
                m.penalties.as<PenaltyToken>(), n_penalties, m.dev<int32_t>(m.off_tokens),
                m.stream);
    m.mark("sampling");
    CUDA_CHECK(cudaMemcpyAsync(m.tokens_out.as<int32_t>(), m.dev<int32_t>(m.off_tokens),
                               size_t(n_samples) * 4, cudaMemcpyDeviceToHost, m.stream));
  }

  // Logits: each sequence's rows are contiguous (sequences in order).
  int64_t r = 0;
  for (const SeqStep& q : batch) {
    if (!q.logits) {
      if (graph || q.sampling) ++r;
      continue;
    }
    const int64_t rows = q.all_logits && !graph ? q.n : 1;
    CUDA_CHECK(cudaMemcpyAsync(q.logits, m.logits.as<float>() + r * V,
                               size_t(rows * V) * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    r += rows;
  }
  m.mark("logits to host");
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  int64_t k = 0;
  for (const SeqStep& q : batch)
    if (q.sampling) *q.sampling->token = m.tokens_out.as<int32_t>()[k++];
  for (const SeqStep& q : batch) q.kv->length += q.n;
}

}  // namespace tandem::cuda
