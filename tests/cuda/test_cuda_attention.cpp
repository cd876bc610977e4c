// The attention half of a layer on the GPU against the CPU backend: paged
// attention (GQA, sliding window, soft-cap, bidirectional key_end, shuffled
// block tables, head dims up to 512 and not a multiple of 4, up to 8 query
// heads per kv head), RoPE, and the KV write.
// Attention runs with 1, 3, 7, 45 and 128 key-range splits (flash-decoding;
// some of them empty on the short contexts), the tensor-core decode kernel
// also with blocks of key warps, and
// through the tensor-core prefill kernel where it takes the head dim.
// Tolerances: attention |gpu - cpu| ≤ 2e-5 + 2e-5·|cpu| (online vs two-pass
// softmax); the prefill kernel ≤ 5e-5 + 5e-5·|cpu| (bf16 hi/lo products
// carry 16 significant bits); RoPE ≤ 1e-5 · (|a| + |b|) (sincosf vs libm); KV write exact.
// Every attention case runs over f32 rows and over bf16 ones (the reference
// reads the same rounded values; same tolerances), the decode part through
// both kernels (the tensor-core one, for bf16 rows of the shapes it takes,
// at the prefill kernel's tolerance), and the KV write rounds bf16 rows bit
// for bit as core/dtype.h does. Every attention run also writes the
// output's bf16 twin (PagedAttention::out_bf16), which must be each output
// value rounded as core/dtype.h rounds it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "model/rope.h"

using namespace tandem;
using namespace tandem::cuda_test;

namespace {

class CudaAttention : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

// The bf16 twin an attention run wrote: each value of `out` rounded.
void expect_twin(const cuda::DeviceBuffer& twin, const std::vector<float>& out,
                 const std::string& what) {
  const auto got = download<uint16_t>(twin, out.size());
  size_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (got[i] != f32_to_bf16(out[i]) && bad++ < 3)
      ADD_FAILURE() << what << " twin [" << i << "] " << got[i] << " for " << out[i];
  EXPECT_EQ(bad, 0u) << what << " twin";
}

// The quantized rows an attention run wrote (PagedAttention::out_quantized)
// against those the quantize kernel of a 4-bit gemv_affine makes of the f32
// output `out` (n rows of `cols`) in its scratch: byte for byte, each row's
// codes and (d, d · Σ q) of every 32-column block (the row's padding past
// them is written by neither).
void expect_quantized(const cuda::DeviceBuffer& codes, const cuda::DeviceBuffer& out, int64_t n,
                      int64_t cols, const std::string& what) {
  // Any 4-bit matrix over `cols` columns: only its quantized input is compared.
  const int64_t rows = 64;
  auto data = upload(std::vector<uint32_t>(size_t(rows * cols / 8), 0x12345678u));
  auto scales = upload(std::vector<float>(size_t(rows * cols / 32), 0.5f));
  auto biases = upload(std::vector<float>(size_t(rows * cols / 32), 0.f));
  const cuda::AffineMatrix w{
      data.as<uint32_t>(), scales.as<float>(), biases.as<float>(), 4, 32, rows, cols};
  cuda::DeviceBuffer scratch(cuda::gemv_affine_scratch_bytes(4, n, cols)),
      y(size_t(n * rows) * sizeof(float));
  cuda::gemv_affine(w, out.as<float>(), n, y.as<float>(), nullptr, {}, scratch.get(),
                    scratch.bytes());
  const size_t row_bytes = cuda::gemv_affine_quantized_row_bytes(cols);
  const size_t used = size_t(cols / 32) * 40;  // 32 code bytes and a float2 a block
  const auto want = download<uint8_t>(scratch, size_t(n) * row_bytes);
  const auto got = download<uint8_t>(codes, size_t(n) * row_bytes);
  size_t bad = 0;
  for (int64_t t = 0; t < n; ++t)
    for (size_t i = 0; i < used; ++i) {
      const size_t at = size_t(t) * row_bytes + i;
      if (got[at] != want[at] && bad++ < 3)
        ADD_FAILURE() << what << " quantized row " << t << " byte " << i << ": " << int(got[at])
                      << ", the quantize kernel " << int(want[at]);
    }
  EXPECT_EQ(bad, 0u) << what << " quantized rows";
}

struct Case {
  int64_t heads, kv_heads, head_dim, ctx, n, window;
  float softcap;
  bool bidirectional;
};

TEST_F(CudaAttention, PagedAttentionMatchesCpu) {
  ThreadPool pool(2);
  const int64_t block_size = 16;
  for (const Case& c :
       {Case{4, 2, 32, 40, 1, 0, 0.f, false}, Case{8, 8, 64, 300, 5, 0, 0.f, false},
        Case{4, 1, 256, 77, 3, 16, 0.f, false}, Case{2, 2, 512, 50, 2, 0, 50.f, false},
        Case{4, 2, 96, 64, 20, 0, 0.f, true}, Case{6, 3, 80, 33, 33, 8, 0.f, false},
        // Gemma 4 E2B's global layers (8 query heads on one kv head of 512)
        // and a head dim that is not a multiple of 4.
        Case{8, 1, 512, 70, 2, 0, 0.f, false}, Case{6, 2, 18, 45, 3, 0, 0.f, false},
        // Query-head groups split over blocks: Gemma 4's sliding layers (8
        // heads of 256: 2 blocks), and 5 heads of 512 (3 blocks, uneven).
        Case{8, 1, 256, 300, 1, 0, 0.f, false}, Case{5, 1, 512, 60, 2, 0, 0.f, false},
        // Prefill chunks: several query tiles, a window inside them, soft-cap
        // with bidirectional rows, Gemma's 256 and 512 head dims.
        Case{4, 2, 64, 150, 100, 40, 0.f, false}, Case{4, 2, 128, 90, 70, 0, 30.f, true},
        Case{4, 1, 256, 140, 130, 0, 0.f, false}, Case{8, 1, 512, 96, 80, 0, 0.f, false},
        // The most query heads the tensor-core decode kernel takes per kv
        // head (16), over many key tiles.
        Case{16, 1, 128, 500, 2, 0, 0.f, false},
        // Long prefill chunks at llama's and qwen's head dims: key tiles
        // inside every row's range (no mask) and straddling it, a window
        // wide enough for unmasked tiles.
        Case{8, 2, 64, 400, 300, 0, 0.f, false}, Case{4, 1, 128, 330, 200, 100, 0.f, false}}) {
    const int64_t kv_dim = c.kv_heads * c.head_dim, q_dim = c.heads * c.head_dim;
    const int64_t nblocks = (c.ctx + block_size - 1) / block_size;
    // Blocks in shuffled order inside a pool with spare blocks.
    std::vector<int32_t> table(static_cast<size_t>(nblocks));
    std::iota(table.begin(), table.end(), 3);
    std::shuffle(table.begin(), table.end(), std::mt19937(9));
    const int64_t pool_blocks = nblocks + 5;
    const auto k = random_floats(size_t(pool_blocks * block_size * kv_dim), 1);
    const auto v = random_floats(size_t(pool_blocks * block_size * kv_dim), 2);
    const auto q = random_floats(size_t(c.n * q_dim), 3);
    const int64_t pos0 = c.ctx - c.n;
    std::vector<int64_t> key_end(size_t(c.n));
    for (int64_t t = 0; t < c.n; ++t)  // bidirectional: the first half sees the whole chunk
      key_end[size_t(t)] = c.bidirectional && t < c.n / 2 ? c.ctx : pos0 + t + 1;

    // Rows as f32, then as bf16 (the CPU reference reads the same rounded
    // values, so the tolerances are the f32 ones).
    for (const bool bf16 : {false, true}) {
      const char* rows = bf16 ? " (bf16 rows)" : "";
      std::vector<float> kc = k, vc = v;
      std::vector<uint16_t> kb(k.size()), vb(v.size());
      for (size_t i = 0; bf16 && i < k.size(); ++i) {
        kb[i] = f32_to_bf16(k[i]);
        vb[i] = f32_to_bf16(v[i]);
        kc[i] = bf16_to_f32(kb[i]);
        vc[i] = bf16_to_f32(vb[i]);
      }
      cpu::AttentionParams cp;
      cp.heads = c.heads;
      cp.kv_heads = c.kv_heads;
      cp.head_dim = c.head_dim;
      cp.scale = 1.f / std::sqrt(float(c.head_dim));
      cp.softcap = c.softcap;
      cp.window = c.window;
      cp.k_base = kc.data();
      cp.v_base = vc.data();
      cp.blocks = table.data();
      cp.block_size = block_size;
      cp.key_end = c.bidirectional ? key_end.data() : nullptr;
      std::vector<float> want(size_t(c.n * q_dim));
      cpu::attention(pool, q.data(), pos0, c.n, cp, want.data());

      std::vector<int64_t> positions(size_t(c.n));
      for (int64_t t = 0; t < c.n; ++t) positions[size_t(t)] = pos0 + t;
      const std::vector<int32_t> seq(size_t(c.n), 0), start = {0};
      auto dk = bf16 ? upload(kb) : upload(kc), dv = bf16 ? upload(vb) : upload(vc), dq = upload(q),
           dt = upload(table), de = upload(key_end), dp = upload(positions), ds = upload(seq),
           dst = upload(start);
      cuda::StepLayout at;
      at.positions = dp.as<int64_t>();
      at.key_end = de.as<int64_t>();
      at.seq = ds.as<int32_t>();
      at.tables = dt.as<int32_t>();
      at.table_start = dst.as<int32_t>();
      cuda::PagedAttention base;
      base.heads = c.heads;
      base.kv_heads = c.kv_heads;
      base.head_dim = c.head_dim;
      base.scale = cp.scale;
      base.softcap = c.softcap;
      base.window = c.window;
      base.k_base = dk.get();
      base.v_base = dv.get();
      base.kv_bf16 = bf16;
      base.block_size = block_size;
      // Both decode kernels: on CUDA cores (any rows) and on tensor cores
      // (bf16 rows of the shapes it takes; q·scale as hi/lo parts, so the
      // prefill kernel's tolerance).
      for (const cuda::DecodeKernel kernel :
           {cuda::DecodeKernel::CudaCores, cuda::DecodeKernel::TensorCores}) {
        const bool mma = kernel == cuda::DecodeKernel::TensorCores;
        if (mma && !cuda::attention_decode_mma_supported(base)) continue;
        double worst = 0, worst_bf16 = 0;
        // The tensor-core kernel also with blocks of key warps (one block
        // per split; the warps share its keys and merge in shared memory),
        // their tiles in one stage (a grid of more blocks than SMs: here
        // multiprocessors = 1) or two, copying its first tile in two parts
        // (one_new_key: every row is in place before the launch here, so the
        // results must not move), and with q and the softmax weights
        // rounded to bf16 (bf16_inputs: about 2e-3 relative error per
        // input, so the prefill kernel's 1e-2).
        struct Variant {
          int key_warps = 1;
          bool one_new_key = false;
          int multiprocessors = 0;
          bool bf16_inputs = false;
          // The chunked kernel (PagedAttention::chunked), with its bulk row
          // copies (sm_90) or cp.async (as before sm_90: cp_async_only).
          bool chunked = false;
          bool cp_async_only = false;
          // The chunked kernel's splits merged in a thread-block cluster
          // (merge_in_cluster, 2 to 4 splits), not by the combine kernel.
          bool merge = false;
        };
        std::vector<Variant> variants = {{}};
        if (mma) {
          variants.push_back({1, true});
          variants.push_back({1, false, 0, true});
        }
        if (mma && cuda::attention_decode_key_warps(base) > 1) {
          const int kw = cuda::attention_decode_key_warps(base);
          for (const bool one_new_key : {false, true})
            for (const int sms : {0, 1}) variants.push_back({kw, one_new_key, sms});
          variants.push_back({kw, false, 1, true});
          variants.push_back({kw, false, 0, true});
        }
        if (mma && cuda::attention_decode_chunked_supported(base))
          for (const bool one_new_key : {false, true})
            for (const bool bf16_inputs : {false, true})
              for (const bool cp_async_only : {false, true})
                variants.push_back({1, one_new_key, 0, bf16_inputs, true, cp_async_only});
        if (mma && cuda::attention_decode_chunked_supported(base) &&
            cuda::attention_decode_cluster_max_splits(c.head_dim) >= 4)
          for (const bool one_new_key : {false, true})
            for (const bool bf16_inputs : {false, true})
              variants.push_back({1, one_new_key, 0, bf16_inputs, true, false, true});
        for (const Variant& v : variants)
          for (int splits :
               v.merge ? std::vector<int>{2, 3, 4} : std::vector<int>{1, 3, 7, 45, 128}) {
            const double tol = v.bf16_inputs ? 1e-2 : mma ? 5e-5 : 2e-5;
            cuda::DeviceBuffer dout(want.size() * sizeof(float));
            cuda::DeviceBuffer partial(std::max<size_t>(4, cuda::attention_partial_floats(
                                                               c.n, c.heads, c.head_dim, splits)) *
                                       sizeof(float));
            cuda::PagedAttention gp = base;
            gp.splits = splits;
            gp.key_warps = v.key_warps;
            gp.one_new_key = v.one_new_key;
            gp.multiprocessors = v.multiprocessors;
            gp.bf16_inputs = v.bf16_inputs;
            gp.chunked = v.chunked;
            gp.cp_async_only = v.cp_async_only;
            gp.merge_in_cluster = v.merge;
            gp.partial = partial.as<float>();
            // Merged in the cluster, the kernel writes no partials: they stay NaN.
            if (v.merge) {
              ASSERT_TRUE(cuda::attention_decode_chunked_merges(gp));
              ASSERT_EQ(cudaMemset(partial.get(), 0xff, partial.bytes()), cudaSuccess);
            }
            cuda::DeviceBuffer twin(want.size() * 2);
            gp.out_bf16 = twin.as<uint16_t>();
            // The tensor-core kernels also write the o projection's quantized input.
            const bool quantizes = mma && cuda::attention_quantizes_out(gp);
            cuda::DeviceBuffer codes(
                quantizes ? size_t(c.n) * cuda::gemv_affine_quantized_row_bytes(q_dim) : 16);
            if (quantizes) gp.out_quantized = codes.as<uint8_t>();
            cuda::attention_paged(dq.as<float>(), c.n, at, gp, dout.as<float>(), nullptr, kernel);
            const auto got = download<float>(dout, want.size());
            const std::string what =
                std::string(mma ? "tensor-core " : "") + "H" + std::to_string(c.heads) + " K" +
                std::to_string(c.kv_heads) + " Dh" + std::to_string(c.head_dim) + " ctx " +
                std::to_string(c.ctx) + " splits " + std::to_string(splits) + " key warps " +
                std::to_string(v.key_warps) + (v.one_new_key ? " one new key" : "") +
                (v.multiprocessors ? " one stage" : "") + (v.bf16_inputs ? " bf16 inputs" : "") +
                (v.chunked ? (v.cp_async_only ? " chunked (cp.async)" : " chunked") : "") +
                (v.merge ? " merged in a cluster" : "") + rows;
            size_t bad = 0;
            for (size_t i = 0; i < got.size(); ++i) {
              const double err = std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i]));
              double& w = v.bf16_inputs ? worst_bf16 : worst;
              w = std::max(w, std::isnan(err) ? 1e30 : err);
              if (!(std::fabs(got[i] - want[i]) <= tol + tol * std::fabs(want[i])) && bad++ < 3)
                ADD_FAILURE() << what << " [" << i << "] gpu " << got[i] << " cpu " << want[i];
            }
            EXPECT_EQ(bad, 0u) << what;
            expect_twin(twin, got, what);
            if (quantizes) expect_quantized(codes, dout, c.n, q_dim, what);
            if (v.merge) {
              const auto left = download<uint32_t>(partial, partial.bytes() / 4);
              EXPECT_EQ(std::count(left.begin(), left.end(), 0xffffffffu),
                        std::ptrdiff_t(left.size()))
                  << what << ": partials written, so the splits did not merge in the cluster";
            }
          }
        if (mma)
          std::printf(
              "[decode attention, tensor cores] H%lld K%lld Dh%lld n %lld%s: max |gpu - cpu| / "
              "(1 + |cpu|) = %.2e (bf16 inputs %.2e)\n",
              (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim, (long long)c.n,
              rows, worst, worst_bf16);
      }
      // The tensor-core prefill kernel, where it takes this head dim.
      if (!cuda::attention_prefill_supported(c.head_dim, 0)) continue;
      const std::vector<int32_t> tiles = cuda::attention_prefill_tiles(seq.data(), c.n);
      auto dtiles = upload(tiles);
      // q·scale and the weights as hi/lo parts (f32-level), or rounded to
      // bf16 (bf16_inputs: about 2e-3 relative error per input, so 1e-2);
      // the bf16 kernel (attention_prefill_bf16) where it takes the shape,
      // with one warp per 16 query rows and (head dims 256, 512) two.
      for (int variant = 0; variant < 4; ++variant) {
        const bool bf16_inputs = variant > 0, bf16_kernel = variant >= 2;
        const int split = variant == 3 ? 2 : 1;
        cuda::PagedAttention gp = base;
        gp.bf16_inputs = bf16_inputs;
        if (bf16_kernel && !cuda::attention_prefill_bf16_takes(gp, 0, split)) continue;
        const double tol = bf16_inputs ? 1e-2 : 5e-5;
        const char* how = variant == 3  ? " (bf16 kernel, split 2)"
                          : bf16_kernel ? " (bf16 kernel, split 1)"
                          : bf16_inputs ? " (bf16 inputs)"
                                        : "";
        cuda::DeviceBuffer dout(want.size() * sizeof(float)), twin(want.size() * 2);
        gp.out_bf16 = twin.as<uint16_t>();
        const int64_t n_tiles = int64_t(tiles.size() / 2);
        if (bf16_kernel)
          cuda::attention_prefill_bf16(dq.as<float>(), at, dtiles.as<int32_t>(), n_tiles, gp,
                                       dout.as<float>(), nullptr, split);
        else
          cuda::attention_prefill(dq.as<float>(), at, dtiles.as<int32_t>(), n_tiles, gp,
                                  dout.as<float>(), nullptr);
        const auto got = download<float>(dout, want.size());
        expect_twin(twin, got, std::string("prefill kernel") + how);
        size_t bad = 0;
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double err = std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i]));
          worst = std::max(worst, std::isnan(err) ? 1e30 : err);
          if (!(std::fabs(got[i] - want[i]) <= tol + tol * std::fabs(want[i])) && bad++ < 3)
            ADD_FAILURE() << "prefill kernel" << how << " H" << c.heads << " K" << c.kv_heads
                          << " Dh" << c.head_dim << " ctx " << c.ctx << " n " << c.n << rows << " ["
                          << i << "] gpu " << got[i] << " cpu " << want[i];
        }
        std::printf(
            "[prefill attention%s] H%lld K%lld Dh%lld n %lld%s: max |gpu - cpu| / (1 + |cpu|) = "
            "%.2e\n",
            how, (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim, (long long)c.n,
            rows, worst);
        EXPECT_EQ(bad, 0u) << "prefill kernel" << how << ", head_dim " << c.head_dim << rows;
      }
    }
  }
}

// The one-warp decode blocks an SM holds (the decoder's one-wave split
// rule): at least one at every head dim, no more at a wider dim (each takes
// more shared memory), and as many as the SM's shared memory allows at dim
// 512 (83.7 KB a block: 2 in sm_90's 228 KB).
TEST_F(CudaAttention, OneWarpBlocksPerSmFollowSharedMemory) {
  int last = 1 << 30;
  for (int64_t dim : {64, 128, 256, 512}) {
    cuda::PagedAttention p;
    p.head_dim = dim;
    const int blocks = cuda::attention_decode_one_warp_blocks_per_sm(p);
    EXPECT_GE(blocks, 1) << "head dim " << dim;
    EXPECT_LE(blocks, last) << "head dim " << dim;
    last = blocks;
  }
  int device = 0, smem = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
            cudaSuccess);
  if (smem >= 200 * 1024 && smem < 250 * 1024) {
    EXPECT_EQ(last, 2) << smem << " bytes an SM";
  }
}

// Quantized output rows come from the tensor-core decode kernels only: the
// CUDA-core kernel, a head dim that is not a multiple of 32 (a block would
// span two heads) and the prefill kernels refuse them, with the reason,
// before launching anything.
TEST_F(CudaAttention, QuantizedOutputNeedsTheTensorCoreDecodeKernels) {
  cuda::DeviceBuffer codes(4096);
  cuda::PagedAttention p;
  p.heads = 4;
  p.kv_heads = 1;
  p.head_dim = 64;
  p.kv_bf16 = true;
  p.block_size = 16;
  p.out_quantized = codes.as<uint8_t>();
  const cuda::StepLayout at;
  float* none = nullptr;
  EXPECT_TRUE(cuda::attention_quantizes_out(p) || !cuda::attention_decode_mma_supported(p));
  EXPECT_THROW(cuda::attention_paged(none, 1, at, p, none, nullptr, cuda::DecodeKernel::CudaCores),
               Error);
  p.head_dim = 80;
  p.kv_bf16 = false;
  EXPECT_FALSE(cuda::attention_quantizes_out(p));
  EXPECT_THROW(cuda::attention_paged(none, 1, at, p, none, nullptr), Error);
  p.head_dim = 64;
  const int32_t* tiles = nullptr;
  EXPECT_THROW(cuda::attention_prefill(none, at, tiles, 1, p, none, nullptr), Error);
}

TEST_F(CudaAttention, RopeMatchesCpu) {
  RopeSpec spec;
  spec.theta = 10000.0;
  for (double partial : {1.0, 0.25}) {
    spec.partial_rotary_factor = partial;
    spec.type = partial < 1 ? RopeType::Proportional : RopeType::Default;
    const int64_t head_dim = 128, heads = 3, n = 9;
    const RopeTable table = make_rope_table(spec, head_dim);
    const auto x = random_floats(size_t(n * heads * head_dim), 4);
    std::vector<int64_t> positions = {0, 1, 2, 17, 255, 1000, 4095, 20000, 32767};
    std::vector<float> want = x;
    for (int64_t t = 0; t < n; ++t)
      apply_rope(table, positions[size_t(t)], want.data() + t * heads * head_dim, heads, head_dim);
    auto dx = upload(x), dp = upload(positions), df = upload(table.inv_freq);
    cuda::rope_rotate_half(dx.as<float>(), n, heads, head_dim, dp.as<int64_t>(), df.as<float>(),
                           table.rotary_dim, table.attention_scaling, nullptr);
    const auto got = download<float>(dx, x.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (std::fabs(x[i]) + 4.0))
          << "partial " << partial << " [" << i << "]";
  }
}

TEST_F(CudaAttention, KvWriteFillsThePagedRows) {
  const int64_t kv_dim = 24, block_size = 16, n = 21, pos0 = 13;
  const std::vector<int32_t> table = {4, 0, 2};  // positions 0..47
  const auto rows = random_floats(size_t(n * kv_dim), 5);
  cuda::DeviceBuffer base(size_t(5 * block_size * kv_dim) * sizeof(float));
  cudaMemset(base.get(), 0, base.bytes());
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) positions[size_t(t)] = pos0 + t;
  const std::vector<int32_t> seq(size_t(n), 0), start = {0};
  auto dr = upload(rows), dt = upload(table), dp = upload(positions), ds = upload(seq),
       dst = upload(start);
  cuda::StepLayout at;
  at.positions = dp.as<int64_t>();
  at.key_end = dp.as<int64_t>();  // unused by the write
  at.seq = ds.as<int32_t>();
  at.tables = dt.as<int32_t>();
  at.table_start = dst.as<int32_t>();
  cuda::kv_write(dr.as<float>(), n, kv_dim, base.get(), false, block_size, at, nullptr);
  const auto got = download<float>(base, size_t(5 * block_size * kv_dim));
  // bf16 rows: the same places, rounded as core/dtype.h rounds.
  cuda::DeviceBuffer base16(size_t(5 * block_size * kv_dim) * sizeof(uint16_t));
  cudaMemset(base16.get(), 0, base16.bytes());
  cuda::kv_write(dr.as<float>(), n, kv_dim, base16.get(), true, block_size, at, nullptr);
  const auto got16 = download<uint16_t>(base16, size_t(5 * block_size * kv_dim));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = pos0 + t;
    const int64_t row = (table[size_t(pos / block_size)] * block_size + pos % block_size) * kv_dim;
    for (int64_t i = 0; i < kv_dim; ++i) {
      ASSERT_EQ(got[size_t(row + i)], rows[size_t(t * kv_dim + i)]);
      ASSERT_EQ(got16[size_t(row + i)], f32_to_bf16(rows[size_t(t * kv_dim + i)]));
    }
  }
}

}  // namespace

namespace {

// Host-side: which step tokens each prefill query tile covers.
TEST(CudaPrefillTiles, RunsOfOneSequenceCutEvery64Tokens) {
  std::vector<int32_t> seq;
  for (int i = 0; i < 150; ++i) seq.push_back(0);  // a prefill chunk: 64 + 64 + 22
  seq.push_back(1);                                // a decode token
  for (int i = 0; i < 3; ++i) seq.push_back(2);    // a short chunk
  const std::vector<int32_t> want = {0, 64, 64, 128, 128, 150, 150, 151, 151, 154};
  EXPECT_EQ(cuda::attention_prefill_tiles(seq.data(), int64_t(seq.size())), want);
  EXPECT_TRUE(cuda::attention_prefill_tiles(seq.data(), 0).empty());
}

// Host-side: decode tokens first go to the decode kernel, the rest is tiled.
TEST(CudaPrefillTiles, LeadingDecodeTokensTakeTheDecodeKernel) {
  // Three decode tokens (sequences 4, 7, 2), a 70-token chunk of sequence 5,
  // then a lone token of sequence 9 (tiled: it follows a run).
  std::vector<int32_t> seq = {4, 7, 2};
  for (int i = 0; i < 70; ++i) seq.push_back(5);
  seq.push_back(9);
  const cuda::PrefillAttentionPlan plan =
      cuda::plan_prefill_attention(seq.data(), int64_t(seq.size()));
  EXPECT_EQ(plan.decode_tokens, 3);
  EXPECT_EQ(plan.tiles, (std::vector<int32_t>{3, 67, 67, 73, 73, 74}));
  // A step that starts with a run tiles everything; one of lone tokens only
  // has no tiles.
  const std::vector<int32_t> run_first = {1, 1, 2};
  EXPECT_EQ(cuda::plan_prefill_attention(run_first.data(), 3).decode_tokens, 0);
  const std::vector<int32_t> lone = {0, 1, 2};
  const cuda::PrefillAttentionPlan all_decode = cuda::plan_prefill_attention(lone.data(), 3);
  EXPECT_EQ(all_decode.decode_tokens, 3);
  EXPECT_TRUE(all_decode.tiles.empty());
}

}  // namespace

namespace {

// A decode step of n sequences, one token each at position ctx - 1 (its
// own paged blocks, shuffled in a pool): for the fused qkv post test.
struct DecodeStep {
  int64_t n, ctx, block_size = 16, nblocks;
  std::vector<int32_t> tables, seq, start;
  std::vector<int64_t> positions, key_end;
  cuda::DeviceBuffer dt, ds, dst, dp, de;
  cuda::StepLayout at;
  DecodeStep(int64_t n_, int64_t ctx_) : n(n_), ctx(ctx_) {
    nblocks = (ctx + block_size - 1) / block_size;
    tables.resize(size_t(n * nblocks));
    std::iota(tables.begin(), tables.end(), 2);
    std::shuffle(tables.begin(), tables.end(), std::mt19937(5));
    for (int64_t t = 0; t < n; ++t) {
      seq.push_back(int32_t(t));
      start.push_back(int32_t(t * nblocks));
      positions.push_back(ctx - 1);
      key_end.push_back(ctx);
    }
    dt = upload(tables), ds = upload(seq), dst = upload(start), dp = upload(positions),
    de = upload(key_end);
    at.positions = dp.as<int64_t>();
    at.key_end = de.as<int64_t>();
    at.seq = ds.as<int32_t>();
    at.tables = dt.as<int32_t>();
    at.table_start = dst.as<int32_t>();
  }
  int64_t pool_rows() const { return (int64_t(tables.size()) + 2) * block_size; }
};

}  // namespace

// A QkvPost's weights on the device for head dim Dh: q and k norm weights
// (random, about 1.5) from seeds `seed` and seed + 1, and RoPE's inverse
// frequencies (base 10,000).
struct PostWeights {
  cuda::DeviceBuffer q_norm, k_norm, inv_freq;
  PostWeights(int64_t Dh, uint32_t seed) {
    std::vector<float> qn = random_floats(size_t(Dh), seed),
                       kn = random_floats(size_t(Dh), seed + 1);
    for (float& w : qn) w += 1.5f;
    for (float& w : kn) w += 1.5f;
    std::vector<float> f(size_t(Dh / 2));
    for (int64_t i = 0; i < Dh / 2; ++i)
      f[size_t(i)] = std::pow(10000.f, -2.f * float(i) / float(Dh));
    q_norm = upload(qn), k_norm = upload(kn), inv_freq = upload(f);
  }
  // The QkvPost both tests start from: these weights, RoPE over the whole
  // head with a scaling of 1.25, q and k norms, no temperature; each test
  // sets the rest.
  cuda::QkvPost post(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t stride,
                     int64_t block_size) const {
    cuda::QkvPost p;
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.stride = stride;
    p.qk_norm = true;
    p.q_norm = q_norm.as<float>();
    p.k_norm = k_norm.as<float>();
    p.inv_freq = inv_freq.as<float>();
    p.rotary_dim = head_dim;
    p.rope_scaling = 1.25f;
    p.temp_base = 8.f;
    p.block_size = block_size;
    return p;
  }
};

// The chunked kernel doing qkv_post's work itself (attention_paged with a
// QkvPost) against qkv_post and then the same kernel: the attention output
// within 1e-3 relative (the norms' sums are taken in another order, which
// can flip a new K or V value's bf16 rounding: 2^-8 of one key's share),
// the new cache rows within one bf16 step, every other row untouched.
// Query-head groups of 1, 4, 8 and 16; own K/V or a shared source layer's
// (q only); v norm and K = V (Gemma 4); the query temperature (Ministral
// 3); splits 1 and 3, and 3 merged in a cluster (the reference through the
// combine kernel); bf16 and hi/lo inputs; bulk copies and cp.async.
TEST_F(CudaAttention, ChunkedKernelFusesTheQkvPost) {
  struct FusedCase {
    int64_t heads, kv_heads, head_dim, n, ctx;
    bool own_kv, v_norm, k_eq_v;
    float temp_beta;
  };
  for (const FusedCase& c : {FusedCase{4, 1, 256, 1, 140, true, false, false, 0.f},
                             FusedCase{8, 1, 256, 3, 300, true, true, true, 0.f},
                             FusedCase{16, 2, 128, 2, 77, true, false, false, 0.1f},
                             FusedCase{4, 4, 64, 5, 40, true, false, false, 0.f},
                             FusedCase{8, 1, 256, 2, 130, false, false, false, 0.f}}) {
    const int64_t Dh = c.head_dim, Q = c.heads * Dh, KV = c.kv_heads * Dh;
    const int64_t stride = Q + (c.k_eq_v ? KV : 2 * KV);
    DecodeStep step(c.n, c.ctx);
    const int64_t kv_values = step.pool_rows() * KV;
    std::vector<uint16_t> k0(static_cast<size_t>(kv_values)), v0(static_cast<size_t>(kv_values));
    const auto kf = random_floats(k0.size(), 21), vf = random_floats(v0.size(), 22);
    for (size_t i = 0; i < k0.size(); ++i) {
      k0[i] = f32_to_bf16(kf[i]);
      v0[i] = f32_to_bf16(vf[i]);
    }
    const auto qkv = random_floats(size_t(c.n * stride), 23);
    const PostWeights weights(Dh, 24);
    auto dqkv = upload(qkv);

    for (const bool bf16_inputs : {false, true})
      for (const bool cp_async_only : {false, true})
        for (const int splits : {1, 3, -3}) {
          // -3: three splits merged in a cluster (bulk copies, sm_90+).
          const bool merge = splits < 0;
          if (merge && (cp_async_only || cuda::attention_decode_cluster_max_splits(Dh) < 3))
            continue;
          auto rk = upload(k0), rv = upload(v0), fk = upload(k0), fv = upload(v0);
          cuda::QkvPost post = weights.post(c.heads, c.kv_heads, Dh, stride, step.block_size);
          post.own_kv = c.own_kv;
          post.k_eq_v = c.k_eq_v;
          post.v_norm = c.v_norm;
          post.temp_beta = c.temp_beta;
          post.kv_bf16 = true;
          cuda::PagedAttention p;
          p.heads = c.heads;
          p.kv_heads = c.kv_heads;
          p.head_dim = Dh;
          p.scale = 1.f / std::sqrt(float(Dh));
          p.kv_bf16 = true;
          p.block_size = step.block_size;
          p.splits = std::abs(splits);
          p.chunked = true;
          p.one_new_key = true;
          p.bf16_inputs = bf16_inputs;
          p.cp_async_only = cp_async_only;
          cuda::DeviceBuffer partial(
              std::max<size_t>(4, cuda::attention_partial_floats(c.n, c.heads, Dh, p.splits)) * 4);
          p.partial = partial.as<float>();
          const std::string what =
              "H" + std::to_string(c.heads) + " K" + std::to_string(c.kv_heads) + " Dh" +
              std::to_string(Dh) + " n " + std::to_string(c.n) + " splits " +
              std::to_string(p.splits) + (merge ? " merged in a cluster" : "") +
              (c.own_kv ? "" : " shared kv") + (bf16_inputs ? " bf16 inputs" : "") +
              (cp_async_only ? " cp.async" : "");
          ASSERT_TRUE(cuda::attention_decode_chunked_supported(p)) << what;

          // Reference: qkv_post, then the chunked kernel over its q.
          cuda::DeviceBuffer dq(size_t(c.n * Q) * 4), want_out(size_t(c.n * Q) * 4),
              got_out(size_t(c.n * Q) * 4);
          post.q_out = dq.as<float>();
          post.k_cache = rk.get();
          post.v_cache = rv.get();
          cuda::qkv_post(dqkv.as<float>(), c.n, step.at, post, nullptr);
          p.k_base = rk.get();
          p.v_base = rv.get();
          cuda::attention_paged(dq.as<float>(), c.n, step.at, p, want_out.as<float>(), nullptr,
                                cuda::DecodeKernel::TensorCores);
          // Fused, on its own copy of the rows.
          post.q_out = nullptr;
          post.k_cache = fk.get();
          post.v_cache = fv.get();
          p.k_base = fk.get();
          p.v_base = fv.get();
          ASSERT_TRUE(cuda::attention_decode_chunked_fuses_post(p, post)) << what;
          p.merge_in_cluster = merge;
          cuda::attention_paged(dqkv.as<float>(), c.n, step.at, p, got_out.as<float>(), nullptr,
                                cuda::DecodeKernel::TensorCores, &post);

          const auto want = download<float>(want_out, size_t(c.n * Q));
          const auto got = download<float>(got_out, size_t(c.n * Q));
          size_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i)
            if (!(std::fabs(got[i] - want[i]) <= 1e-3 * (1.0 + std::fabs(want[i]))) && bad++ < 3)
              ADD_FAILURE() << what << " out [" << i << "] fused " << got[i] << " unfused "
                            << want[i];
          EXPECT_EQ(bad, 0u) << what;
          const auto wk = download<uint16_t>(rk, k0.size()), gk = download<uint16_t>(fk, k0.size());
          const auto wv = download<uint16_t>(rv, v0.size()), gv = download<uint16_t>(fv, v0.size());
          size_t moved = 0, off_by_more = 0;
          for (size_t i = 0; i < k0.size(); ++i)
            for (const auto& [w, g] : {std::pair{wk[i], gk[i]}, std::pair{wv[i], gv[i]}}) {
              moved += w != g;
              off_by_more += std::abs(int(w) - int(g)) > 1;
            }
          EXPECT_EQ(off_by_more, 0u) << what << ": cache rows more than one bf16 step apart";
          EXPECT_LE(moved, size_t(c.n * KV / 8)) << what << ": cache values that differ";
          if (c.own_kv) {  // the new rows were written at all
            const int64_t pos = c.ctx - 1;
            const int64_t row = (step.tables[size_t(pos / step.block_size)] * step.block_size +
                                 pos % step.block_size) *
                                KV;
            EXPECT_NE(gk[size_t(row)], k0[size_t(row)]) << what << ": new K row not written";
          }
        }
  }
}

namespace {

// qkv_post over a step of many tokens (the warp-per-head kernel, from 8
// tokens on; switched on here in case the environment has it off) against the same tokens one
// call each (the block kernel the decode steps and the parity tests run): queries within 1e-5
// relative (the norm's sum is taken in another order), cache rows bit for bit over f32 rows and
// within one bf16 step over bf16 ones. Head dims 64, 128 and 256; q/k norms, v norm, K = V, shared
// K/V (q only), no RoPE, the query temperature.
TEST_F(CudaAttention, QkvPostOfManyTokensMatchesOneTokenAtATime) {
  setenv("TANDEM_CUDA_QKV_POST_WARPS", "1", 1);
  struct Unset {
    ~Unset() { unsetenv("TANDEM_CUDA_QKV_POST_WARPS"); }
  } unset;
  struct PostCase {
    int64_t heads, kv_heads, head_dim;
    bool qk_norm, v_norm, k_eq_v, own_kv, rope, kv_bf16;
    float temp_beta;
  };
  for (const PostCase& c : {PostCase{32, 8, 64, false, false, false, true, true, true, 0.f},
                            PostCase{16, 8, 128, true, false, false, true, true, false, 0.1f},
                            PostCase{4, 1, 256, true, false, false, true, true, true, 0.f},
                            PostCase{8, 1, 256, true, true, true, true, true, false, 0.f},
                            PostCase{8, 2, 128, true, false, false, false, true, true, 0.f},
                            PostCase{4, 2, 64, false, false, false, true, false, false, 0.f}}) {
    const int64_t n = 40, ctx = 50, Dh = c.head_dim, Q = c.heads * Dh, KV = c.kv_heads * Dh;
    const int64_t stride = Q + (c.k_eq_v ? KV : 2 * KV);
    DecodeStep step(n, ctx);
    for (int64_t t = 0; t < n; ++t) step.positions[size_t(t)] = 3 + 7 * t % ctx;
    step.dp = upload(step.positions);
    step.at.positions = step.dp.as<int64_t>();
    const size_t kv_bytes = size_t(step.pool_rows() * KV) * (c.kv_bf16 ? 2 : 4);
    const auto qkv = random_floats(size_t(n * stride), 31);
    const PostWeights weights(Dh, 32);
    auto dqkv = upload(qkv);
    const std::vector<uint8_t> zeros(kv_bytes, 0);
    cuda::DeviceBuffer many_q(size_t(n * Q) * 4), one_q(size_t(n * Q) * 4);
    cuda::DeviceBuffer many_k = upload(zeros), many_v = upload(zeros), one_k = upload(zeros),
                       one_v = upload(zeros);
    cuda::QkvPost post = weights.post(c.heads, c.kv_heads, Dh, stride, step.block_size);
    post.own_kv = c.own_kv;
    post.k_eq_v = c.k_eq_v;
    post.qk_norm = c.qk_norm;
    post.v_norm = c.v_norm;
    post.rotary_dim = c.rope ? Dh : 0;
    post.temp_beta = c.temp_beta;
    post.kv_bf16 = c.kv_bf16;
    post.q_out = many_q.as<float>();
    post.k_cache = many_k.get();
    post.v_cache = many_v.get();
    cuda::qkv_post(dqkv.as<float>(), n, step.at, post, nullptr);
    for (int64_t t = 0; t < n; ++t) {
      cuda::StepLayout one = step.at;
      one.positions += t;
      one.key_end += t;
      one.seq += t;
      cuda::QkvPost p1 = post;
      p1.q_out = one_q.as<float>() + t * Q;
      p1.k_cache = one_k.get();
      p1.v_cache = one_v.get();
      cuda::qkv_post(dqkv.as<float>() + t * stride, 1, one, p1, nullptr);
    }
    const std::string what = "H" + std::to_string(c.heads) + " K" + std::to_string(c.kv_heads) +
                             " Dh" + std::to_string(Dh) + (c.own_kv ? "" : " shared kv") +
                             (c.rope ? "" : " no rope") + (c.kv_bf16 ? " bf16 rows" : "");
    const auto want = download<float>(one_q, size_t(n * Q)),
               got = download<float>(many_q, size_t(n * Q));
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= 1e-5 * (1.0 + std::fabs(want[i]))) && bad++ < 3)
        ADD_FAILURE() << what << " q [" << i << "] " << got[i] << " one at a time " << want[i];
    EXPECT_EQ(bad, 0u) << what;
    size_t written = 0;
    for (const auto& [a, b] : {std::pair{&many_k, &one_k}, std::pair{&many_v, &one_v}}) {
      if (c.kv_bf16) {
        const auto g = download<uint16_t>(*a, kv_bytes / 2),
                   w = download<uint16_t>(*b, kv_bytes / 2);
        for (size_t i = 0; i < g.size(); ++i) {
          written += w[i] != 0;
          EXPECT_LE(std::abs(int(g[i]) - int(w[i])), 1) << what << " cache row value " << i;
        }
      } else {
        const auto g = download<float>(*a, kv_bytes / 4), w = download<float>(*b, kv_bytes / 4);
        for (size_t i = 0; i < g.size(); ++i) {
          written += w[i] != 0.f;
          EXPECT_LE(std::fabs(g[i] - w[i]), 1e-5 * (1.0 + std::fabs(w[i])))
              << what << " cache " << i;
        }
      }
    }
    EXPECT_EQ(written > 0, c.own_kv) << what;
  }
}

}  // namespace
