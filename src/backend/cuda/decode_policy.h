// The CUDA decoder's tuning policy: which kernel paths a step takes and how
// its attention splits, each a measured default that an environment switch
// overrides for measuring (docs/architecture.md lists the switches;
// decode_policy.cpp keeps the measurements that chose each default). The
// counts are read once, on first use; the on/off switches at each call.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tandem::cuda {

// Decode steps captured in CUDA graphs unless TANDEM_CUDA_GRAPHS=0.
bool graphs_enabled_by_env();
// Prefill attention on tensor cores (attention_prefill) unless
// TANDEM_CUDA_PREFILL_ATTENTION=0.
bool prefill_kernel_enabled();

// The tensor-core decode attention's splits: one-warp blocks per SM to aim
// for, and the fewest keys a split keeps.
int decode_blocks_per_sm();
int64_t decode_min_split_keys();
// Key warps per tensor-core decode block, and the most keys a warp keeps
// before a step splits over blocks (given the kernel's key tile).
int decode_key_warps();
int64_t decode_warp_keys(int64_t tile_keys);

// The most key splits of a (token, kv head) in one-warp decode blocks (head
// dim 512, or any with TANDEM_DECODE_KEY_WARPS=1) over `keys` keys: 16 up to
// 512 keys, one per 32 keys up to 32 splits (1,024 keys), then one per 64
// keys. Measured on the H200 at batch 1 (tok/s at 16 / 32 / 64 splits),
// gemma-3-1b context 128 769 / 761 / 741, context 1024 731 / 753 / 740;
// gemma-4-e2b 372 / 368 / 360 and 356 / 365 / 362; at context 4,096
// (one-warp blocks at dim 256) 32 splits or one per 64 keys: gemma-3-1b
// 727 → 748, gemma-4-e2b 358 → 364. On the H100 (session 38, gemma-4-e2b,
// 4 / 8 / 16 / 32, two runs): context 128 391.4 / 395.5 / 398.0 / 391.6 and
// 392.9 / 394.8 / 397.3 / 394.4; context 1,024 (8 / 16 / 32) 387.3 / 386.8
// / 388.3, at 8 and 32 sequences the same within 0.6%. Key warps are not
// capped here: they take up to attention_splits' 64 warps (llama-3.2-1b at
// context 4096: 872 with 32, 922 with 64; qwen3-1.7b 544 / 575).
int64_t one_warp_max_splits(int64_t keys);

// The chunked decode kernel (PagedAttention::chunked): the least head dim
// that takes it, the most (token, kv head) units a step may have at a head
// dim, and the fewest keys each split keeps.
int64_t decode_chunked_min_dim();
int64_t decode_chunked_units(int64_t head_dim);
int64_t decode_chunked_split_keys();
// The most splits of a chunked step.
constexpr int64_t kChunkedMaxSplits = 64;
// Whether the splits of a chunked step of `units` (token, kv head) units (up
// to attention_decode_cluster_max_splits) merge in a thread-block cluster
// instead of by the combine kernel; quantized_out: the attention also
// writes the o projection's 4-bit input (PagedAttention::out_quantized).
constexpr int64_t kClusterMergeMaxUnits = 2;
bool cluster_merge_enabled(int64_t units, bool quantized_out);

// Whether a decode step on the chunked kernel folds qkv_post into it.
bool fuses_qkv_post(const PagedAttention& p, const QkvPost& post);

// The decode GEMVs' fused input norm, residual add and gated activation.
bool gemv_fusion_enabled();
// Gemma 4's per-layer block fused into the GEMVs around it.
bool ple_fusion_enabled();
// Decode-only steps copy each sequence's earlier keys before the PDL wait
// (PagedAttention::one_new_key) unless TANDEM_DECODE_EARLY_KEYS=0.
bool early_keys_enabled();
// Decode graphs' cuBLAS GEMMs on algorithms GemmTuner times and chooses,
// and whether each shape's times are logged (else one line a tuning).
bool gemm_tuning_enabled();
bool gemm_tuning_verbose();

// Steps whose longest run of one sequence's tokens reaches this many take
// attention_prefill (each query tile is 16 to 64 rows of mma work).
constexpr int64_t kPrefillKernelMinRun = 16;

}  // namespace tandem::cuda
