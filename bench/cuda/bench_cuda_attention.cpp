// Prefill attention on the GPU: one causal prompt of T tokens attended at
// real models' head shapes, through the tensor-core prefill kernel
// (attention_prefill, over q and weights as bf16 hi/lo parts and rounded to
// bf16), its bf16 variant (attention_prefill_bf16, bf16 rows; at head dims 256 and 512 with one
// and two warps per 16 query rows) and the decode kernel
// (attention_paged, one block per token and kv head), timed with CUDA events. Prints ms and useful
// TFLOP/s (causal: 2 · T² · head_dim · heads multiply-adds, q·k and p·v, counted once: the kernel's
// bf16 hi/lo products do three mma per product). Then decode: one token attending a context of
// 1,024 or 4,096 keys through the decode kernel with the split count the decoder uses (and its
// combine), in µs per call and GB/s of K/V read; and 64 sequences of 1,024 keys each decoding
// together. Every figure over f32 rows and over bf16 ones (the default on CUDA); decode over bf16
// rows through both kernels (CUDA cores, and tensor cores where attention_decode_mma_supported).
// Last, the chunked decode kernel (PagedAttention::chunked) at the decoder's split rule; its
// calls cycle over copies of the cache that together exceed the L2, so the rows come from HBM
// as in a step.
//
//   bench_cuda_attention [--json] [--chunked-only]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/decode_policy.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench_util.h"

using namespace tandem;

namespace {

struct Shape {
  const char* model;
  int64_t heads, kv_heads, head_dim;
};

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
  cuda::DeviceBuffer b(v.size() * sizeof(T));
  CUDA_CHECK(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice));
  return b;
}

constexpr int64_t kBlockSize = 16;

// `sequences` sequences of `ctx` positions each in a paged cache of f32 or
// bf16 rows (each sequence's blocks in order, after the previous one's).
// With one sequence its last n tokens are the step's queries, each seeing
// the keys up to its own position (causal); with several, n must equal
// their count: one decode token each, at its last position. Attention
// parameters for the shape.
struct CausalStep {
  cuda::DeviceBuffer k, v, q, out, table, seq, start, pos, key_end;
  std::vector<int32_t> host_seq;
  cuda::StepLayout at;
  cuda::PagedAttention p;

  CausalStep(const Shape& sh, int64_t ctx, int64_t n, bool bf16_rows, int64_t sequences = 1) {
    const int64_t kv_dim = sh.kv_heads * sh.head_dim, q_dim = sh.heads * sh.head_dim;
    const int64_t per_seq = (ctx + kBlockSize - 1) / kBlockSize, blocks = per_seq * sequences;
    k = cuda::DeviceBuffer(size_t(blocks * kBlockSize * kv_dim) * (bf16_rows ? 2 : 4));
    v = cuda::DeviceBuffer(k.bytes());
    q = cuda::DeviceBuffer(size_t(n * q_dim) * 4);
    out = cuda::DeviceBuffer(q.bytes());
    for (cuda::DeviceBuffer* b : {&k, &v, &q}) CUDA_CHECK(cudaMemset(b->get(), 0x3c, b->bytes()));
    std::vector<int32_t> blocks_in_order(static_cast<size_t>(blocks)), starts;
    std::iota(blocks_in_order.begin(), blocks_in_order.end(), 0);
    for (int64_t i = 0; i < sequences; ++i) starts.push_back(int32_t(i * per_seq));
    host_seq.assign(static_cast<size_t>(n), 0);
    std::vector<int64_t> positions(static_cast<size_t>(n)), ends(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      if (sequences > 1) host_seq[size_t(t)] = int32_t(t);
      positions[size_t(t)] = sequences > 1 ? ctx - 1 : ctx - n + t;
      ends[size_t(t)] = positions[size_t(t)] + 1;
    }
    table = upload(blocks_in_order);
    seq = upload(host_seq);
    start = upload(starts);
    pos = upload(positions);
    key_end = upload(ends);
    at.positions = pos.as<int64_t>();
    at.key_end = key_end.as<int64_t>();
    at.seq = seq.as<int32_t>();
    at.tables = table.as<int32_t>();
    at.table_start = start.as<int32_t>();
    p.heads = sh.heads;
    p.kv_heads = sh.kv_heads;
    p.head_dim = sh.head_dim;
    p.scale = 0.125f;
    p.k_base = k.get();
    p.v_base = v.get();
    p.kv_bf16 = bf16_rows;
    p.block_size = kBlockSize;
  }
};

}  // namespace

// µs per call of `call(i)` for i = 0, 1, ... `reps` - 1, the calls captured
// in one graph (launched one by one, the launch overhead would dominate).
template <class Call>
double graph_us_per_call(int reps, Call&& call) {
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  call(0, stream);  // set-up
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const double seconds = bench::graph_seconds(
      [&] {
        for (int i = 0; i < reps; ++i) call(i, stream);
      },
      1, stream);
  cudaStreamDestroy(stream);
  return seconds * 1e6 / reps;
}

// The chunked decode kernel: `sequences` tokens, each attending `ctx` keys,
// split as the decoder splits a chunked step (one split per 128 keys, at
// most one block an SM per (token, kv head) and kChunkedMaxSplits), the
// combine included.
void bench_chunked(const Shape& sh, int64_t sequences, int64_t ctx, int sms, bool json) {
  const int64_t units = sequences * sh.kv_heads;
  const int64_t most = std::clamp<int64_t>(sms / units, 1, cuda::kChunkedMaxSplits);
  const int keys = cuda::attention_decode_chunk_keys();
  const int splits = int(std::clamp<int64_t>((ctx + keys - 1) / keys, 1, most));
  const double kv_bytes = 2.0 * double(sequences * ctx * sh.kv_heads * sh.head_dim) * 2;
  // Copies of the cache that together hold at least 256 MB (the H100's and
  // H200's L2 is 50 MB), each with its own q, output and partials.
  const int copies = int(std::clamp(256e6 / kv_bytes, 1.0, 16.0));
  std::vector<std::unique_ptr<CausalStep>> steps;
  std::vector<cuda::DeviceBuffer> partials;
  for (int i = 0; i < copies; ++i) {
    steps.push_back(std::make_unique<CausalStep>(sh, ctx, sequences, true, sequences));
    partials.emplace_back(
        cuda::attention_partial_floats(sequences, sh.heads, sh.head_dim, splits) * 4 + 4);
  }
  std::vector<cuda::PagedAttention> ps;
  for (int i = 0; i < copies; ++i) {
    cuda::PagedAttention p = steps[size_t(i)]->p;
    p.splits = splits;
    p.multiprocessors = sms;
    p.chunked = true;
    p.bf16_inputs = true;
    p.one_new_key = true;
    p.partial = partials[size_t(i)].as<float>();
    ps.push_back(p);
  }
  if (!cuda::attention_decode_chunked_supported(ps[0])) return;
  const double us = graph_us_per_call(20 * copies, [&](int i, cudaStream_t stream) {
    CausalStep& st = *steps[size_t(i % copies)];
    cuda::attention_paged(st.q.as<float>(), sequences, st.at, ps[size_t(i % copies)],
                          st.out.as<float>(), stream, cuda::DecodeKernel::TensorCores);
  });
  const double gbs = kv_bytes / (us * 1e-6) / 1e9;
  if (json)
    std::printf(
        "{\"shape\": \"%s\", \"kernel\": \"chunked decode\", \"sequences\": %lld, "
        "\"context\": %lld, \"splits\": %d, \"us\": %.2f, \"kv_gbs\": %.1f}\n",
        sh.model, (long long)sequences, (long long)ctx, splits, us, gbs);
  else
    std::printf(
        "%-20s chunked decode, %2lld x context %5lld, %2d splits  %8.2f us  %7.1f GB/s of K/V\n",
        sh.model, (long long)sequences, (long long)ctx, splits, us, gbs);
}

int main(int argc, char** argv) {
  bool json = false, chunked_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    if (!std::strcmp(argv[i], "--chunked-only")) chunked_only = true;
  }
  if (!bench::have_device("bench_cuda_attention")) return 1;
  const int sms = cuda::device_info(0).multiprocessors;
  if (chunked_only) {
    const std::vector<Shape> chunked_shapes = {
        {"gemma-3-1b", 4, 1, 256}, {"qwen3-1.7b", 16, 8, 128}, {"ministral-3-3b", 32, 8, 128}};
    for (const Shape& sh : chunked_shapes)
      for (const int64_t n : {1, 8, 32})
        for (const int64_t ctx : {160, 512, 1024, 4096})
          if (n * sh.kv_heads <= cuda::decode_chunked_units(sh.head_dim))
            bench_chunked(sh, n, ctx, sms, json);
    return 0;
  }
  // Then everything below, and the chunked kernel at the end.
  const std::vector<Shape> shapes = {{"llama-3.2-1b", 32, 8, 64},
                                     {"qwen3-1.7b", 16, 8, 128},
                                     {"gemma-3-1b", 4, 1, 256},
                                     {"gemma-4-e2b global", 8, 1, 512}};
  for (const Shape& sh : shapes)
    for (int64_t T : {512, 4096})
      for (const bool bf16 : {false, true}) {
        CausalStep step(sh, T, T, bf16);
        const cuda::StepLayout& at = step.at;
        const cuda::PagedAttention& p = step.p;
        const std::vector<int32_t> tiles = cuda::attention_prefill_tiles(step.host_seq.data(), T);
        auto d_tiles = upload(tiles);
        const double flops = 2.0 * double(T) * double(T) * double(sh.head_dim) * double(sh.heads);
        const char* rows = bf16 ? "bf16" : "f32";
        // The prefill kernel over hi/lo parts and over bf16 inputs (the
        // decoder's default), the bf16 kernel (bf16 rows and inputs), and
        // the decode kernel (the slow path, timed once: f32 rows).
        // The bf16 kernel with one warp per 16 query rows and with two
        // (head dims 256 and 512).
        enum Kernel { kHiLo, kBf16Inputs, kBf16Kernel, kBf16Split2, kDecode };
        for (const Kernel kind : {kHiLo, kBf16Inputs, kBf16Kernel, kBf16Split2, kDecode}) {
          cuda::PagedAttention kp = p;
          const bool bf16_kernel = kind == kBf16Kernel || kind == kBf16Split2;
          const int split = kind == kBf16Split2 ? 2 : 1;
          kp.bf16_inputs = kind == kBf16Inputs || bf16_kernel;
          if (kind != kDecode && !cuda::attention_prefill_supported(sh.head_dim, 0)) continue;
          if (bf16_kernel && !cuda::attention_prefill_bf16_takes(kp, 0, split)) continue;
          if (kind == kDecode && bf16) continue;
          const int64_t n_tiles = int64_t(tiles.size() / 2);
          auto run = [&] {
            if (kind == kDecode)
              cuda::attention_paged(step.q.as<float>(), T, at, kp, step.out.as<float>(), nullptr);
            else if (bf16_kernel)
              cuda::attention_prefill_bf16(step.q.as<float>(), at, d_tiles.as<int32_t>(), n_tiles,
                                           kp, step.out.as<float>(), nullptr, split);
            else
              cuda::attention_prefill(step.q.as<float>(), at, d_tiles.as<int32_t>(), n_tiles, kp,
                                      step.out.as<float>(), nullptr);
          };
          const double step_ms = 1e3 * bench::seconds_per_call(run, kind == kDecode ? 2 : 10),
                       tflops = flops / (step_ms * 1e-3) / 1e12;
          const char* kernel = kind == kHiLo         ? "prefill (tensor cores)"
                               : kind == kBf16Inputs ? "prefill, bf16 inputs"
                               : kind == kBf16Kernel ? "prefill bf16 kernel"
                               : kind == kBf16Split2 ? "prefill bf16 kernel, split 2"
                                                     : "decode (CUDA cores)";
          if (json)
            std::printf(
                "{\"shape\": \"%s\", \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, "
                "\"tokens\": %lld, \"rows\": \"%s\", \"kernel\": \"%s\", \"ms\": %.3f, "
                "\"tflops\": %.1f}\n",
                sh.model, (long long)sh.heads, (long long)sh.kv_heads, (long long)sh.head_dim,
                (long long)T, rows, kernel, step_ms, tflops);
          else
            std::printf(
                "%-20s H%-3lld K%-2lld Dh%-4lld T %5lld %-4s rows  %-29s %9.3f ms  %6.1f TFLOP/s\n",
                sh.model, (long long)sh.heads, (long long)sh.kv_heads, (long long)sh.head_dim,
                (long long)T, rows, kernel, step_ms, tflops);
        }
      }

  // Decode: one token at position ctx - 1 of each of `sequences` sequences.
  struct DecodeCase {
    int64_t sequences, ctx;
  };
  for (const Shape& sh : shapes)
    for (const DecodeCase dc : {DecodeCase{1, 1024}, DecodeCase{1, 4096}, DecodeCase{64, 1024}})
      for (const int variant : {0, 1, 2}) {  // f32 rows; bf16 rows on CUDA cores; on tensor cores
        const bool bf16 = variant > 0;
        const cuda::DecodeKernel kernel =
            variant == 2 ? cuda::DecodeKernel::TensorCores : cuda::DecodeKernel::CudaCores;
        const int64_t n = dc.sequences, ctx = dc.ctx;
        CausalStep step(sh, ctx, n, bf16, n);
        const cuda::StepLayout& at = step.at;
        cuda::PagedAttention& p = step.p;
        const int64_t kv_dim = sh.kv_heads * sh.head_dim;
        p.splits = cuda::attention_splits(
            n, sh.kv_heads, sms,
            variant == 2 ? cuda::kTensorCoreBlocksPerSm : cuda::kCudaCoreBlocksPerSm);
        p.multiprocessors = sms;
        cuda::DeviceBuffer partial(
            cuda::attention_partial_floats(n, sh.heads, sh.head_dim, p.splits) * 4 + 4);
        p.partial = partial.as<float>();
        if (variant == 2 && !cuda::attention_decode_mma_supported(p)) continue;
        // 200 calls captured in one graph, as the decoder replays them.
        const double us = graph_us_per_call(200, [&](int, cudaStream_t stream) {
          cuda::attention_paged(step.q.as<float>(), n, at, p, step.out.as<float>(), stream, kernel);
        });
        const double gbs = 2.0 * double(n * ctx * kv_dim) * (bf16 ? 2 : 4) / (us * 1e-6) / 1e9;
        const char* rows = bf16 ? "bf16" : "f32";
        const char* cores = variant == 2 ? "tensor cores" : "CUDA cores";
        if (json)
          std::printf(
              "{\"shape\": \"%s\", \"decode_sequences\": %lld, \"decode_context\": %lld, "
              "\"rows\": \"%s\", \"kernel\": \"%s\", \"splits\": %d, \"us\": %.2f, "
              "\"kv_gbs\": %.1f}\n",
              sh.model, (long long)n, (long long)ctx, rows, cores, p.splits, us, gbs);
        else
          std::printf(
              "%-20s decode, %2lld x context %5lld, %-4s rows, %-12s %3d splits  %8.2f us  %7.1f "
              "GB/s of K/V\n",
              sh.model, (long long)n, (long long)ctx, rows, cores, p.splits, us, gbs);
      }
  for (const Shape& sh : shapes)
    for (const int64_t n : {1, 32})
      if (n * sh.kv_heads <= cuda::decode_chunked_units(sh.head_dim))
        bench_chunked(sh, n, 1024, sms, json);
  return 0;
}
