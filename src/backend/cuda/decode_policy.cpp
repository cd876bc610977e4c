#include "backend/cuda/decode_policy.h"

#include <algorithm>

#include "backend/cuda/runtime.h"

namespace tandem::cuda {

bool graphs_enabled_by_env() {
  return !env_is("TANDEM_CUDA_GRAPHS", "0");
}

// Prefill attention on tensor cores (attention_prefill) unless
// TANDEM_CUDA_PREFILL_ATTENTION=0 (for measuring it against the decode
// kernel).
bool prefill_kernel_enabled() {
  return !env_is("TANDEM_CUDA_PREFILL_ATTENTION", "0");
}

// The tensor-core decode kernel's split policy: one-warp blocks per SM to
// aim for (TANDEM_DECODE_BLOCKS_PER_SM, default 4; at most
// kTensorCoreBlocksPerSm · 2 = the partial buffer's bound) and the fewest
// keys a split keeps (TANDEM_DECODE_MIN_SPLIT_KEYS, default 64; 1: no cap)
// unless that leaves fewer blocks than SMs. Measured on the H200
// (bench/results/cuda-decode-fusion-2026-12-03.md): 8 per SM against 2
// gave llama-3.2-1b at 32 sequences 12,755 -> 14,482 tok/s; the 64-key
// cap then gave gemma-3-1b at 32 sequences 10,716 -> 11,774 and
// gemma-4-e2b 4,136 -> 4,393 (one kv head: many short splits), llama at
// batch 1, context 128, 820 -> 881, and left llama at 32 and 64 sequences
// as it was. Without the one-block-per-SM floor it cost gemma-3-1b at
// batch 1 628 -> 591. Since key warps share a block, 4 against 8
// (cuda-pdl-coherence-2026-12-04.md, run 9; context 1,024, tok/s at 1 / 8
// / 32 sequences): llama 1,022 -> 1,013 / 6,113 -> 6,227 / 19,596 ->
// 19,778, ministral-3-3b 398 -> 400 / 2,483 -> 2,646 / 7,993 -> 8,002,
// qwen3-1.7b 611 -> 610 / 3,370 -> 3,666 / 10,408 -> 10,403, gemma-3-1b 891
// -> 885 / 4,811 -> 4,826 / 15,681 -> 16,209, gemma-4-e2b 406 -> 408 /
// 2,330 -> 2,341 / 7,261 -> 7,682.
int decode_blocks_per_sm() {
  static const int n = int(std::clamp<int64_t>(env_count("TANDEM_DECODE_BLOCKS_PER_SM", 4), 1,
                                               2 * kTensorCoreBlocksPerSm - 1));
  return n;
}

// Key warps per tensor-core decode block (PagedAttention::key_warps): the
// kernel's most unless TANDEM_DECODE_KEY_WARPS is below it (one-warp blocks
// then: the kernel has no shapes in between); and the most keys a warp
// keeps before a step splits over blocks: two of the kernel's key tiles (64
// keys at dims 64 and 128, 32 at 256), unless TANDEM_DECODE_WARP_KEYS says
// otherwise (llama-3.2-1b at batch 1, context 1024, 64 / 128 / 256: 959 /
// 956 / 910 tok/s).
int decode_key_warps() {
  static const int n = int(std::clamp<int64_t>(env_count("TANDEM_DECODE_KEY_WARPS", 8), 1, 8));
  return n;
}

int64_t decode_warp_keys(int64_t tile_keys) {
  static const int64_t n = env_count("TANDEM_DECODE_WARP_KEYS", 0);
  return n > 0 ? n : 2 * tile_keys;
}

// The chunked decode kernel (PagedAttention::chunked) on layers of head dim
// TANDEM_DECODE_CHUNKED_MIN_DIM (default 128) or more whose step has at most
// TANDEM_DECODE_CHUNKED_UNITS (token, kv head) units (default 16, and 64 at
// head dim 256 and up; 0: never), each split keeping at least
// TANDEM_DECODE_CHUNKED_SPLIT_KEYS keys (default one chunk), up to a block per
// SM and kChunkedMaxSplits; below head dim 256 only while one chunk a split
// covers the keys (else the key-warp blocks). Measured on the H200 against the
// key-warp blocks (tok/s, bench_cuda_decode, session 14 runs 2-4): at head dim
// 256, gemma-3-1b batch 1 881 -> 949 (context 128) and 857 -> 926 (4,096),
// gemma-4-e2b 424 -> 457 and 413 -> 442, at 2 and 8 sequences +4-6%; at dim
// 128 with several chunks a split, qwen3-1.7b 665 -> 616 at 4,096 and
// ministral-3-3b 401 -> 387; with one (session 15 run 3, qkv post unfused),
// qwen3 739 -> 749 at context 128 and 717 -> 743 at 1,024, ministral 437 ->
// 442 and 422 -> 437, at 4,096 and 8 sequences within 1% (the key-warp blocks
// there); at dim 64, llama-3.2-1b 1,213 -> 983 at 128 — hence the 128 floor.
int64_t decode_chunked_min_dim() {
  static const int64_t n = env_count("TANDEM_DECODE_CHUNKED_MIN_DIM", 128);
  return n;
}

// Gemma's one kv head makes few units: at 32 sequences the key-warp blocks
// (3 splits of 8 warps a unit, 96 blocks) left SMs idle; measured on the
// H100 (session 23, context 1,024, tok/s) with the limit at 128: gemma-3-1b
// 32 sequences 14,600 -> 15,566, 64 26,218 -> 27,021, gemma-4-e2b 64 12,097
// -> 12,348 (16 sequences already chunked). 128 units are not measured.
int64_t decode_chunked_units(int64_t head_dim) {
  static const int64_t n = env_count("TANDEM_DECODE_CHUNKED_UNITS", -1);
  return n >= 0 ? n : head_dim >= 256 ? 64 : 16;
}

int64_t one_warp_max_splits(int64_t keys) {
  return std::max<int64_t>(std::clamp<int64_t>(keys / 32, 16, 32), keys / 64);
}

int64_t decode_chunked_split_keys() {
  static const int64_t n = std::max<int64_t>(
      1, env_count("TANDEM_DECODE_CHUNKED_SPLIT_KEYS", attention_decode_chunk_keys()));
  return n;
}

int64_t decode_min_split_keys() {
  static const int64_t n = std::max<int64_t>(1, env_count("TANDEM_DECODE_MIN_SPLIT_KEYS", 64));
  return n;
}

// The chunked kernel's splits merged inside a thread-block cluster
// (PagedAttention::merge_in_cluster) instead of by the combine kernel after
// it: TANDEM_DECODE_CLUSTER_MERGE=0 never, 1 on every chunked step, else on
// steps of at most kClusterMergeMaxUnits (token, kv head) units whose
// attention does not also write the o projection's 4-bit input. Measured on
// the H100 (session 41, tok/s, combine -> cluster, context 128 unless
// said): bf16 batch 1 gemma-3-1b 826.7 / 824.5 -> 854.2 / 853.6 and
// gemma-4-e2b 394.1 / 393.5 -> 399.6 / 401.8 (one unit: one cluster a
// layer), batch 2 gemma-3-1b 1,325 / 1,343 -> 1,372 / 1,382 and gemma-4-e2b
// 696.2 / 697.7 -> 707.5 / 709.2, gemma-3-1b at context 4,096 786.1 ->
// 790.4; but with 8 units qwen3-1.7b 604.5 / 603.8 -> 570.7 / 572.3 and
// ministral-3-3b 368.8 / 368.3 -> 343.7 / 341.9 at batch 1, gemma-3-1b at
// 8 and 32 sequences (context 1,024) 5,547 -> 5,150 and 18,155 -> 16,854,
// gemma-4-e2b 2,616 -> 2,449 and 8,632 -> 8,589; packed 4-bit at batch 1
// gemma-3-1b 1,224 / 1,230 / 1,226 -> 1,209 / 1,199 / 1,207, gemma-4-e2b
// 672.5 / 670.0 / 670.8 -> 654.5 / 670.4 / 674.0 (qwen3-1.7b, 8 units: 1,107
// -> 1,179, one run). Launching the clusters with the combine kernel kept
// cost qwen3 and ministral nothing measurable (a diagnostic build): their
// loss comes with the step that has no combine kernel, as with the o GEMV's
// prologue merging (session 40), not with the clusters. Session 42: it is
// PDL's — with TANDEM_CUDA_PDL=0 the merge wins on ministral (331.9 ->
// 337.0), and the o GEMV's weight loads moved after its PDL wait change
// nothing (340.6 -> 340.6). Not because the kernel after the cluster
// launch loses its early start: bench_cuda_cluster_pdl (session 43) shows
// it entering as soon as the cluster kernel triggers. The atomic-counter
// merge of session 28 lost everywhere.
bool cluster_merge_enabled(int64_t units, bool quantized_out) {
  if (env_is("TANDEM_DECODE_CLUSTER_MERGE", "0")) return false;
  if (env_is("TANDEM_DECODE_CLUSTER_MERGE", "1")) return true;
  return units <= kClusterMergeMaxUnits && !quantized_out;
}

// Decode steps on the chunked attention kernel fold qkv_post into it
// (attention_decode_chunked_fuses_post) at head dim 256 and up when each of
// the block's warps then takes at most one head — the G query heads and the
// new K and V — unless TANDEM_CUDA_FUSE_QKV_POST=0 (never) or 1 (wherever
// the kernel can). Measured on the H200 (tok/s, unfused → fused):
// gemma-3-1b (4 query heads: 6 over 8 warps) batch 1 921 → 976 at context
// 128, 914 → 936 at 4,096, 8 sequences 5,024 → 5,193, batch 2 1,476 →
// 1,462; gemma-4-e2b (8: 10 over 8 warps, two warps take two heads) 451 →
// 437 and 436 → 431, 8 sequences 2,479 → 2,513; at dim 128 (session 15 run
// 3) qwen3-1.7b (2 query heads) 749 → 729 at context 128 and 743 → 727 at
// 1,024, ministral-3-3b (4) 442 → 443 and 437 → 433. Gemma 4's kv-shared
// layers (8 query heads and no K and V: one head a warp) fused too lost on
// the H100 (session 41, batch 1, context 128: 404.3 / 404.7 → 399.6 / 401.8).
bool fuses_qkv_post(const PagedAttention& p, const QkvPost& post) {
  if (env_is("TANDEM_CUDA_FUSE_QKV_POST", "0")) return false;
  const bool pays =
      p.head_dim >= 256 && p.heads / p.kv_heads + 2 <= attention_decode_chunked_warps(p.head_dim);
  return (pays || env_is("TANDEM_CUDA_FUSE_QKV_POST", "1")) &&
         attention_decode_chunked_fuses_post(p, post);
}

// The decode GEMVs' fused input norm, residual add and gated activation
// (GemvFusion) on steps every projection takes as a GEMV, unless
// TANDEM_CUDA_FUSE_GEMV=0 (for measuring them against the separate kernels).
bool gemv_fusion_enabled() {
  return !env_is("TANDEM_CUDA_FUSE_GEMV", "0");
}

// Gemma 4's per-layer block in two launches instead of four on fused
// (sandwich) steps — the gate's activation times the per-layer input in the
// gate GEMV's epilogue (GemvFusion::times), the block's output norm, residual
// add and layer scalar in the next layer's q/k/v GEMV (pre_add,
// pre_add_scale) — unless TANDEM_CUDA_FUSE_PLE=0 (for measuring).
bool ple_fusion_enabled() {
  return !env_is("TANDEM_CUDA_FUSE_PLE", "0");
}

bool early_keys_enabled() {
  static const bool on = !env_is("TANDEM_DECODE_EARLY_KEYS", "0");  // for measuring
  return on;
}

// The decode graphs' cuBLAS GEMMs on the fastest cuBLASLt algorithm
// (GemmTuner) unless TANDEM_CUDA_GEMM_TUNE=0. Measured on the H100
// (session 37, context 1,024, tok/s, cublasGemmEx -> tuned, two rounds
// alternated): 32 sequences gemma-3-1b 18,072 -> 18,420 and 18,086 ->
// 18,304, gemma-4-e2b 8,507 -> 8,560 and 8,519 -> 8,552, llama-3.2-1b
// 17,718 -> 17,873 and 17,736 -> 17,870, qwen3-1.7b 9,000 -> 9,083 and
// 9,045 -> 9,103, ministral-3-3b 6,910 -> 6,960 and 6,922 -> 6,963; 64 /
// 128 sequences gemma-3-1b 28,922 -> 29,510 / 45,762 -> 46,660,
// llama-3.2-1b 27,367 -> 27,508 / 38,931 -> 39,578. The heads' GEMMs gain
// most (gemma-3-1b's at 32 tokens 221 -> 213 µs).
bool gemm_tuning_enabled() {
  return !env_is("TANDEM_CUDA_GEMM_TUNE", "0");
}

bool gemm_tuning_verbose() {
  return env_is("TANDEM_CUDA_GEMM_TUNE", "verbose");
}

}  // namespace tandem::cuda
