// The CUDA decoder against the CPU decoder (the oracle) on every parity
// fixture (Llama, Qwen2/3, Gemma 3/4 with per-layer embeddings and KV
// sharing, Ministral 3 with the query temperature; f32, bf16, f16):
//  - prefill in steps of gemv_max_tokens() tokens (the GEMV path, f32
//    activations): every position's logits within 1e-4 × their std;
//  - prefill in steps of 16 and 256 tokens (cuBLAS: SGEMM for f32 weights,
//    one bf16 GEMM over hi/lo-split activations for bf16 ones,
//    GemmInputs::HiLo): within
//    1e-4 × std, except
//    Gemma 4 with bf16 weights: 2e-3 (measured 1.1e-3, against 5e-5 for the
//    other bf16 fixtures: the rounding of the split itself, amplified by the
//    tiny random Gemma 4 — the CPU decoder fed the same 16-bit activations
//    into each matmul moves by 7e-4 to 2.4e-3 × std on the Gemma 4 fixtures
//    and 4e-5 to 6e-5 on the others; transformers' own bf16 run is 1.9 ×
//    std off there). Steps of 16 and 256 run once with the decode attention
//    kernel (TANDEM_CUDA_PREFILL_ATTENTION=0: the tolerances above) and once
//    with the tensor-core prefill kernel, whose bf16 hi/lo products carry 16
//    significant bits (about 1e-5 relative error per attention output,
//    against 1e-7): within 1e-3 × std (measured up to 5.9e-4, Gemma 4 with
//    its attention scale of 1), Gemma 4 with bf16 weights 4e-3 (measured
//    2.1e-3);
//  - greedy decode through the CUDA graphs equal to transformers' greedy
//    tokens (reference.json "greedy");
//  - with bf16 KV rows (the default on CUDA), steps of gemv_max_tokens()
//    and of 256 with the prefill kernel against the CPU decoder rounding its
//    rows to bf16 (Decoder::round_kv_rows_to_bf16), greedy tokens included
//    (bf16 rows alone move these tiny random models' logits by 1.6e-2 to
//    3.1e-2 × std, Gemma 4's by 0.25 to 0.49, where 2 or 3 of 16 greedy
//    tokens differ from transformers' f32 run);
//  - with bf16 GEMM inputs (GemmInputs::Bf16, the serving default: bf16
//    activations into the GEMMs and bf16 q and softmax weights in the
//    prefill attention kernel), steps of 256 with f32 and with bf16 rows,
//    against the CPU decoder rounding its matmul inputs (and rows) the same
//    way: within 0.1 × std (measured up to 6.2e-2), Gemma 4 1.5 (measured
//    up to 0.84). Loose, because the CPU does not round the attention's
//    inputs, GPU and CPU activations a few ulp apart round to different
//    bf16 values near rounding boundaries, and these tiny random models
//    amplify both (transformers' own bf16 run is 1.9 × std off on Gemma 4);
//    the kernels' own bf16 modes are held tighter in their tests. Printed
//    beside it: how far the bf16 inputs moved the logits from the f32 path.
//    The batching tests below take the hi/lo path, to compare tightly,
//    and the first of them the bf16 serving numerics as well.
// And batching: sequences of different lengths prefilled together and then
// decoded together (graph buckets with padding rows) give each sequence the
// logits it gets alone on the CPU; so does a decode token beside another
// sequence's prefill chunk (the two attention kernels in one step). And the
// real models' head dims (128, 256), which no fixture has, through the
// decode kernels and both prefill attention kernels (CudaDecoderWideHeads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/decoder.h"
#include "backend/cuda/runtime.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"
#include "model/decoder.h"
#include "model/kv_pool.h"
#include "model/model.h"
#include "model/synth.h"

using namespace tandem;
using namespace tandem::cuda_test;

namespace {

// All logits of `ids` on the CPU.
std::vector<float> cpu_logits(const Model& m, const std::vector<int32_t>& ids) {
  ThreadPool pool(2);
  const int64_t n = int64_t(ids.size());
  KvPool kv_pool = single_sequence_pool(m.spec, n + 1, Decoder::kDefaultStepTokens);
  Decoder cpu(m, pool, kv_pool);
  SequenceKv kv;
  std::vector<float> out(size_t(n * m.spec.vocab));
  run_sequence(cpu, ids.data(), n, kv, out.data(), true);
  return out;
}

// `count` greedy tokens after `prompt_logits` (the prompt's last row
// decides the first), one token per step through `runner` over `kv`.
std::vector<int32_t> greedy_tokens(StepRunner& runner, SequenceKv& kv,
                                   const std::vector<float>& prompt_logits, size_t count) {
  const int64_t V = runner.spec().vocab;
  std::vector<float> last(prompt_logits.end() - V, prompt_logits.end());
  std::vector<int32_t> out;
  for (size_t i = 0; i < count; ++i) {
    const int32_t id = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(id);
    if (i + 1 < count) run_sequence(runner, &id, 1, kv, last.data(), false);
  }
  return out;
}

// The CPU decoder with its KV rows rounded to bf16 (the oracle of a GPU
// runner keeping bf16 rows): every logit of `ids`, then `count` greedy
// tokens.
std::pair<std::vector<float>, std::vector<int32_t>> cpu_bf16_rows(const Model& m,
                                                                  const std::vector<int32_t>& ids,
                                                                  size_t count) {
  ThreadPool pool(2);
  const int64_t n = int64_t(ids.size());
  KvPool kv_pool =
      single_sequence_pool(m.spec, n + int64_t(count) + 1, Decoder::kDefaultStepTokens);
  Decoder cpu(m, pool, kv_pool);
  cpu.round_kv_rows_to_bf16(true);
  SequenceKv kv;
  std::vector<float> logits(size_t(n * m.spec.vocab));
  run_sequence(cpu, ids.data(), n, kv, logits.data(), true);
  std::vector<int32_t> greedy = greedy_tokens(cpu, kv, logits, count);
  return {std::move(logits), std::move(greedy)};
}

// The CPU decoder rounding the inputs of its matmuls over bf16 weights to
// bf16 on steps of at least `min_rows` tokens (by default those past the
// GPU's GEMV limit: the oracle of a GPU runner with bf16 GEMM inputs), and
// its KV rows when `bf16_rows`: every logit of `ids`.
std::vector<float> cpu_bf16_gemm_inputs(const Model& m, const std::vector<int32_t>& ids,
                                        bool bf16_rows,
                                        int64_t min_rows = cuda::Decoder::gemv_max_tokens() + 1) {
  ThreadPool pool(2);
  const int64_t n = int64_t(ids.size());
  KvPool kv_pool = single_sequence_pool(m.spec, n + 1, Decoder::kDefaultStepTokens);
  Decoder cpu(m, pool, kv_pool);
  cpu.round_kv_rows_to_bf16(bf16_rows);
  cpu.round_bf16_matmul_inputs(min_rows);
  SequenceKv kv;
  std::vector<float> out(size_t(n * m.spec.vocab));
  run_sequence(cpu, ids.data(), n, kv, out.data(), true);
  return out;
}

// GPU runs keeping bf16 KV rows against the CPU decoder rounding its rows
// the same way (max |gpu - cpu| / std of the logits): what remains is the
// f32-level difference of the two, plus the K and V values whose bf16
// rounding that difference flips — one bf16 step (2^-8 relative) each. The
// prefill lane of bf16 weights (16-bit activations into cuBLAS) flips the
// most. Measured on the H200: up to 6.3e-3 (gemma3_text-bf16, 256-token
// steps), Gemma 4 up to 0.16 (gemma4-bf16; its tiny random model moves by
// 0.25-0.49 × std when the rows are rounded at all).
double bf16_rows_tolerance(const std::string& fixture) {
  return fixture.rfind("gemma4", 0) == 0 ? 0.3 : 1e-2;
}

class CudaDecoder : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

TEST_P(CudaDecoder, LogitsMatchTheCpuDecoderAndGreedyMatchesTransformers) {
  const std::string dir = fixture(GetParam());
  auto model = load_model(dir);
  std::ifstream f(dir + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<int32_t> prompt = ref["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = ref["greedy"].get<std::vector<int32_t>>();
  const int64_t n = int64_t(prompt.size()), V = model->spec.vocab;
  const std::vector<float> want_f32 = cpu_logits(*model, prompt);
  const auto [want_bf16, greedy_bf16] = cpu_bf16_rows(*model, prompt, greedy.size());

  const int64_t gemv = cuda::Decoder::gemv_max_tokens();
  struct Lane {
    int64_t step_tokens;
    bool prefill_kernel;
    DType rows;              // the KV rows' type
    bool bf16_gemm = false;  // GemmInputs::Bf16, else HiLo
  };
  for (const Lane& lane : std::vector<Lane>{{gemv, false, DType::F32},
                                            {16, false, DType::F32},
                                            {256, false, DType::F32},
                                            {16, true, DType::F32},
                                            {256, true, DType::F32},
                                            {gemv, false, DType::BF16},
                                            {256, true, DType::BF16},
                                            {256, true, DType::F32, true},
                                            {256, true, DType::BF16, true}}) {
    const int64_t step_tokens = lane.step_tokens;
    const bool prefill_kernel = lane.prefill_kernel, bf16_rows = lane.rows == DType::BF16;
    KvPool kv_pool = single_sequence_pool(model->spec, n + int64_t(greedy.size()) + 1, step_tokens,
                                          /*host_storage=*/false, lane.rows);
    setenv("TANDEM_CUDA_PREFILL_ATTENTION", prefill_kernel ? "1" : "0", 1);
    cuda::Decoder gpu(*model, kv_pool, step_tokens, 0,
                      lane.bf16_gemm ? cuda::GemmInputs::Bf16 : cuda::GemmInputs::HiLo);
    unsetenv("TANDEM_CUDA_PREFILL_ATTENTION");
    SequenceKv kv;
    std::vector<float> got(size_t(n * V));
    run_sequence(gpu, prompt.data(), n, kv, got.data(), true);
    const std::vector<float>& plain = bf16_rows ? want_bf16 : want_f32;
    const double err = relative_error(
        got, lane.bf16_gemm ? cpu_bf16_gemm_inputs(*model, prompt, bf16_rows) : plain);
    const bool gemma4 = std::string(GetParam()).rfind("gemma4", 0) == 0;
    const bool gemma4_bf16 = gemma4 && std::string(GetParam()).find("bf16") != std::string::npos;
    const double tolerance = lane.bf16_gemm                      ? (gemma4 ? 1.5 : 0.1)
                             : bf16_rows                         ? bf16_rows_tolerance(GetParam())
                             : prefill_kernel                    ? (gemma4_bf16 ? 4e-3 : 1e-3)
                             : step_tokens > gemv && gemma4_bf16 ? 2e-3
                                                                 : 1e-4;
    EXPECT_LE(err, tolerance) << GetParam() << " prefill steps of " << step_tokens
                              << (prefill_kernel ? " (prefill attention kernel)" : "")
                              << (bf16_rows ? " (bf16 KV rows)" : "")
                              << (lane.bf16_gemm ? " (bf16 GEMM inputs)" : "");
    std::printf("[cuda decoder] %-18s steps of %3lld%s%s%s: max|gpu - cpu| = %.2e x std\n",
                GetParam(), (long long)step_tokens, prefill_kernel ? " (prefill kernel)" : "",
                bf16_rows ? " (bf16 rows)" : "", lane.bf16_gemm ? " (bf16 GEMM inputs)" : "", err);
    if (lane.bf16_gemm)
      std::printf("[cuda decoder] %-18s   bf16 GEMM inputs moved the logits by %.2e x std\n",
                  GetParam(), relative_error(got, plain));
    if (step_tokens != gemv) continue;
    // Greedy decode one token at a time (graph replays) from the last logits.
    EXPECT_EQ(greedy_tokens(gpu, kv, got, greedy.size()), bf16_rows ? greedy_bf16 : greedy)
        << GetParam() << (bf16_rows ? " (bf16 KV rows: the CPU decoder rounding its rows)" : "");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDecoder,
                         testing::Values("llama-f32", "llama-bf16", "qwen2-f32", "qwen2-bf16",
                                         "qwen3-f32", "qwen3-bf16", "qwen3-f16", "gemma3_text-f32",
                                         "gemma3_text-bf16", "gemma3-bf16", "gemma4_text-f32",
                                         "gemma4_text-bf16", "gemma4-bf16", "ministral3-f32",
                                         "ministral3-bf16", "mistral3-bf16"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// Three sequences prefilled in one step, then decoded together for several
// steps (batch 3: the graph of bucket 4 with one padding row), with graphs on
// and off; each sequence's logits against the CPU decoder running it alone.
// Two lanes: f32 weights and rows through the hi/lo path, held to 1e-4 ×
// std; and the serving numerics — bf16 weights, bf16 KV rows, bf16 GEMM
// inputs — against the CPU rounding its rows and every matmul input (all
// of the batch's steps, 13 prompt tokens and then 3 decode tokens, are past
// the GEMV limit of 2, so every GPU projection takes bf16 activations),
// within 1e-2 × std (measured on the H200 up to 1.9e-4), Gemma 4 0.3
// (measured up to 8.0e-2; the head of this file says why its tiny random
// model moves so much under bf16 rounding).
TEST(CudaDecoderBatch, SequencesInOneStepMatchEachAlone) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  struct Lane {
    const char* fixture;
    bool serving_numerics;  // bf16 rows and GemmInputs::Bf16, else f32 rows and HiLo
  };
  for (const Lane lane : {Lane{"gemma4_text-f32", false}, Lane{"qwen3-f32", false},
                          Lane{"gemma4_text-bf16", true}, Lane{"qwen3-bf16", true}}) {
    const char* name = lane.fixture;
    const bool bf16 = lane.serving_numerics;
    auto model = load_model(fixture(name));
    const ModelSpec& s = model->spec;
    const int64_t V = s.vocab, steps = 6;
    std::vector<std::vector<int32_t>> seqs = {{5, 17, 3, 99, 42}, {7}, {11, 12, 13, 14, 15, 16, 2}};
    for (auto& q : seqs)  // continuations, fixed in advance
      for (int64_t i = 0; i < steps; ++i) q.push_back(int32_t((q.back() * 31 + 7) % V));
    for (bool graphs : {true, false}) {
      KvPool kv_pool(s, 64, 64, /*host_storage=*/false, bf16 ? DType::BF16 : DType::F32);
      cuda::Decoder gpu(*model, kv_pool, 64, 0,
                        bf16 ? cuda::GemmInputs::Bf16 : cuda::GemmInputs::HiLo);
      gpu.set_graphs(graphs);
      std::vector<SequenceKv> kv(seqs.size());
      std::vector<std::vector<float>> got(seqs.size());
      // Prompt lengths: the sequence minus its continuation.
      auto run = [&](const std::vector<int64_t>& counts) {
        std::vector<SeqStep> step;
        std::vector<std::vector<float>> out(seqs.size());
        for (size_t i = 0; i < seqs.size(); ++i) {
          ASSERT_TRUE(kv_reserve(kv_pool, s, kv[i], kv[i].length + counts[i]));
          out[i].resize(size_t(counts[i] * V));
          step.push_back(
              SeqStep{seqs[i].data() + kv[i].length, counts[i], &kv[i], out[i].data(), true});
        }
        gpu.step(step);
        for (size_t i = 0; i < seqs.size(); ++i)
          got[i].insert(got[i].end(), out[i].begin(), out[i].end());
      };
      std::vector<int64_t> prompt;
      for (auto& q : seqs) prompt.push_back(int64_t(q.size()) - steps);
      run(prompt);
      for (int64_t i = 0; i < steps; ++i) run({1, 1, 1});
      for (size_t i = 0; i < seqs.size(); ++i) {
        const bool gemma4 = std::string(name).rfind("gemma4", 0) == 0;
        const double err = relative_error(
            got[i], bf16 ? cpu_bf16_gemm_inputs(*model, seqs[i], /*bf16_rows=*/true, 1)
                         : cpu_logits(*model, seqs[i]));
        const double tolerance = !bf16 ? 1e-4 : gemma4 ? 0.3 : 1e-2;
        EXPECT_LE(err, tolerance) << name << " sequence " << i << (graphs ? " (graphs)" : "");
        std::printf("[cuda batch] %-16s seq %zu %s: %.2e x std\n", name, i,
                    graphs ? "graphs" : "eager ", err);
      }
    }
  }
}

// Decode graphs of more than 32 sequences run their projections through
// cuBLAS; the decoder times cuBLASLt's algorithms for each such GEMM at the
// first capture of a bucket (GemmTuner), or ahead of the first step
// (prepare), and captures again with the winners. The logits of 40 sequences decoding together must
// be those of the decoder on cublasGemmEx's default (TANDEM_CUDA_GEMM_TUNE=0) within 1e-3 x std
// (f32 sums in another order; measured equal on the H100).
TEST(CudaDecoderBatch, TunedDecodeGemmsGiveTheDefaultLogits) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  for (const char* name : {"qwen3-bf16", "gemma3_text-bf16"}) {
    auto model = load_model(fixture(name));
    const ModelSpec& s = model->spec;
    const int64_t V = s.vocab, sequences = 40, steps = 3;
    auto run = [&](const char* tune, bool ahead) {
      const ScopedEnv env("TANDEM_CUDA_GEMM_TUNE", tune);
      KvPool kv_pool(s, 2 * sequences, 2 * sequences, /*host_storage=*/false, DType::BF16);
      cuda::Decoder gpu(*model, kv_pool, 2 * sequences, 0, cuda::GemmInputs::Bf16);
      if (ahead) gpu.prepare(sequences);
      std::vector<SequenceKv> kv(static_cast<size_t>(sequences));
      std::vector<float> logits;
      for (int64_t i = 0; i <= steps; ++i) {
        // Step 0: each sequence's one-token prompt; then its continuation.
        std::vector<int32_t> ids(static_cast<size_t>(sequences));
        std::vector<float> out(size_t(sequences * V));
        std::vector<SeqStep> step;
        for (int64_t q = 0; q < sequences; ++q) {
          ids[size_t(q)] = int32_t((q * 37 + i * 11 + 5) % V);
          EXPECT_TRUE(kv_reserve(kv_pool, s, kv[size_t(q)], kv[size_t(q)].length + 1));
          step.push_back(SeqStep{&ids[size_t(q)], 1, &kv[size_t(q)], out.data() + q * V, true});
        }
        gpu.step(step);
        logits.insert(logits.end(), out.begin(), out.end());
      }
      return logits;
    };
    const std::vector<float> plain = run("0", false);
    for (const bool ahead : {false, true}) {
      const double err = relative_error(run("1", ahead), plain);
      std::printf("[cuda batch] %s, 40 sequences, GEMMs tuned %s vs cublasGemmEx: %.2e x std\n",
                  name, ahead ? "ahead (prepare)" : "at the first capture", err);
      EXPECT_LE(err, 1e-3) << name << (ahead ? ", tuned ahead" : "");
    }
  }
}

// A step that carries decode tokens and a prefill chunk (the engine's
// order: decode tokens first) splits its attention between the decode
// kernel and the tensor-core prefill kernel; each sequence must still get
// the logits it gets alone on the CPU (within the prefill kernel's 1e-3).
TEST(CudaDecoderBatch, DecodeTokensBesidePrefillChunksMatchEachAlone) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  for (const char* name : {"gemma4_text-f32", "qwen3-f32"}) {
    auto model = load_model(fixture(name));
    const ModelSpec& s = model->spec;
    const int64_t V = s.vocab;
    // a: a 20-token prompt, then decodes; b: arrives one step later with 40.
    std::vector<int32_t> a, b;
    for (int32_t i = 0; i < 24; ++i) a.push_back((i * 37 + 5) % int32_t(V));
    for (int32_t i = 0; i < 43; ++i) b.push_back((i * 53 + 11) % int32_t(V));
    KvPool kv_pool(s, 64, 128, /*host_storage=*/false);
    cuda::Decoder gpu(*model, kv_pool, 128, 0, cuda::GemmInputs::HiLo);
    SequenceKv kv_a, kv_b;
    std::vector<float> got_a, got_b;
    auto run = [&](int64_t na, int64_t nb) {
      std::vector<SeqStep> step;
      std::vector<float> out_a(size_t(na * V)), out_b(size_t(nb * V));
      if (na > 0) {
        ASSERT_TRUE(kv_reserve(kv_pool, s, kv_a, kv_a.length + na));
        step.push_back(SeqStep{a.data() + kv_a.length, na, &kv_a, out_a.data(), true});
      }
      if (nb > 0) {
        ASSERT_TRUE(kv_reserve(kv_pool, s, kv_b, kv_b.length + nb));
        step.push_back(SeqStep{b.data() + kv_b.length, nb, &kv_b, out_b.data(), true});
      }
      gpu.step(step);
      got_a.insert(got_a.end(), out_a.begin(), out_a.end());
      got_b.insert(got_b.end(), out_b.begin(), out_b.end());
    };
    run(20, 0);  // a's prompt alone: tiles only
    run(1, 40);  // a decodes beside b's prompt: 1 decode token, then tiles
    run(1, 1);
    run(1, 1);
    run(1, 1);
    const double err_a = relative_error(got_a, cpu_logits(*model, a));
    const double err_b = relative_error(got_b, cpu_logits(*model, b));
    // The prefill kernel's tolerance (LogitsMatchTheCpuDecoder...): 1e-3 ×
    // std, Gemma 4 4e-3 (measured 2.6e-3 on this prompt; its parity prompt
    // gives 6e-4 — the tiny random model amplifies rounding unevenly).
    const double tolerance = std::string(name).rfind("gemma4", 0) == 0 ? 4e-3 : 1e-3;
    EXPECT_LE(err_a, tolerance) << name << " (the decoding sequence)";
    EXPECT_LE(err_b, tolerance) << name << " (the prefilling sequence)";
    std::printf("[cuda mixed] %-16s decode beside prefill: %.2e / %.2e x std\n", name, err_a,
                err_b);
  }
}

TEST(CudaDecoderBatch, BadStepsAreRefusedBeforeAnythingChanges) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  auto model = load_model(fixture("llama-f32"));
  KvPool kv_pool(model->spec, 8, 8, /*host_storage=*/false);
  cuda::Decoder gpu(*model, kv_pool, 16, 0);
  SequenceKv kv;
  ASSERT_TRUE(kv_reserve(kv_pool, model->spec, kv, 2));
  const int32_t bad[2] = {1, int32_t(model->spec.vocab)};
  SeqStep q{bad, 2, &kv, nullptr, false};
  EXPECT_THROW(gpu.step(std::span<const SeqStep>(&q, 1)), Error);
  EXPECT_EQ(kv.length, 0);
  const int32_t ids[20] = {};
  SeqStep unreserved{ids, 20, &kv, nullptr, false};
  EXPECT_THROW(gpu.step(std::span<const SeqStep>(&unreserved, 1)), Error);
  KvPool host_pool(model->spec, 8, 8);
  EXPECT_THROW(cuda::Decoder(*model, host_pool, 16, 0), Error);
}

// Sampling on the device inside a step: each sequence runs twice in the same
// step, once returning logits and once sampled, so the sampled id must be
// what the CPU Sampler picks from those logits (greedy, and greedy after a
// repetition penalty), on the prefill step (eager) and decode steps (graphs
// on and off). And profile_step names the ops and advances the sequences.
TEST(CudaDecoderBatch, DeviceSamplingPicksWhatTheCpuSamplerPicks) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  auto model = load_model(fixture("qwen3-f32"));
  const ModelSpec& s = model->spec;
  const int64_t V = s.vocab;
  for (bool graphs : {true, false}) {
    KvPool kv_pool(s, 64, 64, /*host_storage=*/false);
    cuda::Decoder gpu(*model, kv_pool, 64, 0);
    gpu.set_graphs(graphs);
    std::vector<int32_t> a = {5, 17, 3, 99}, b = {7, 7, 8};
    std::vector<SequenceKv> kv(4);
    SamplingParams penalized;
    penalized.repetition_penalty = 1.8f;
    for (int round = 0; round < 5; ++round) {
      std::vector<SeqStep> step;
      std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
      int32_t ta = -2, tb = -2;
      StepSampling sa, sb;
      sa.token = &ta;
      sb.params = penalized;
      sb.token = &tb;
      std::vector<TokenPenalty> pen;
      for (int32_t id : b)
        if (std::none_of(pen.begin(), pen.end(), [&](auto& p) { return p.id == id; }))
          pen.push_back({id, 0, 1});
      sb.penalties = pen;
      const std::vector<int32_t>* seq[4] = {&a, &a, &b, &b};
      for (size_t i = 0; i < 4; ++i) {
        const int64_t n = int64_t(seq[i]->size()) - kv[i].length;
        ASSERT_TRUE(kv_reserve(kv_pool, s, kv[i], kv[i].length + n));
        SeqStep q{seq[i]->data() + kv[i].length, n, &kv[i], nullptr, false};
        if (i == 0) q.logits = la.data();
        if (i == 1) q.sampling = &sa;
        if (i == 2) q.logits = lb.data();
        if (i == 3) q.sampling = &sb;
        step.push_back(q);
      }
      if (round == 2) {
        const auto ops = gpu.profile_step(step);
        double total = 0;
        bool saw_attention = false, saw_head = false;
        for (const auto& op : ops) {
          EXPECT_GE(op.ms, 0.0) << op.op;
          total += op.ms;
          saw_attention = saw_attention || op.op == "attention";
          saw_head = saw_head || op.op == "head";
        }
        EXPECT_TRUE(saw_attention && saw_head);
        EXPECT_GT(total, 0.0);
      } else {
        gpu.step(step);
      }
      EXPECT_EQ(ta, argmax(la.data(), V)) << "round " << round;
      Sampler cpu(penalized);
      std::span<const int32_t> prompt(b.data(), b.size());
      EXPECT_EQ(tb, cpu.sample(lb.data(), V, prompt, {})) << "round " << round;
      EXPECT_EQ(kv[0].length, int64_t(a.size()));
      a.push_back(ta);
      b.push_back(tb);
    }
  }
}

}  // namespace

namespace {

// A random bf16 checkpoint at a real model's attention shape (bench/configs/
// `config`, with 3 layers, hidden 256, intermediate 512, vocab 512, and a
// sliding window of 64 on every other layer where the model has one),
// written to a fresh directory under /tmp that the object removes.
struct WideHeadsModel {
  std::string dir;
  std::unique_ptr<Model> model;
  explicit WideHeadsModel(const std::string& config_name, const LoadOptions& options = {}) {
    char dir_template[] = "/tmp/tandem-wide-heads-XXXXXX";
    const char* made = mkdtemp(dir_template);
    if (!made) throw std::runtime_error("mkdtemp failed");
    dir = made;
    nlohmann::json config;
    {
      std::ifstream in(source_path("bench/configs/" + config_name + ".json"));
      config = nlohmann::json::parse(in);
    }
    config["hidden_size"] = 256;
    config["intermediate_size"] = 512;
    config["num_hidden_layers"] = 3;
    config["vocab_size"] = 512;
    if (config.contains("sliding_window")) {
      config["sliding_window"] = 64;
      config["sliding_window_pattern"] = 2;
    }
    std::ofstream(dir + "/config.json") << config.dump(2);
    synth_checkpoint(dir + "/config.json", dir, DType::BF16, 11);
    model = load_model(dir, options);
  }
  ~WideHeadsModel() { std::filesystem::remove_all(dir); }
};

std::vector<int32_t> wide_heads_prompt() {
  std::vector<int32_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919 + 13) % 512);
  return ids;
}

// The CUDA decoder's logits at every position of `ids`, fed in steps of
// `step_tokens` under the serving numerics (bf16 KV rows, bf16 GEMM
// inputs); the decoder reads its environment switches as it is made.
std::vector<float> gpu_serving_logits(const Model& model, const std::vector<int32_t>& ids,
                                      int64_t step_tokens) {
  const int64_t n = int64_t(ids.size());
  KvPool kv_pool = single_sequence_pool(model.spec, n + 1, step_tokens,
                                        /*host_storage=*/false, DType::BF16);
  cuda::Decoder gpu(model, kv_pool, step_tokens, 0, cuda::GemmInputs::Bf16);
  SequenceKv kv;
  std::vector<float> got(size_t(n * model.spec.vocab));
  run_sequence(gpu, ids.data(), n, kv, got.data(), true);
  return got;
}

// The CUDA decoder's logits at every position of `ids`, fed one token per
// step (graph replays) with bf16 KV rows and hi/lo GEMM inputs; the decoder
// reads its environment switches as it is made.
std::vector<float> gpu_one_token_logits(const Model& model, const std::vector<int32_t>& ids) {
  const int64_t n = int64_t(ids.size());
  KvPool kv_pool = single_sequence_pool(model.spec, n + 1, 1, /*host_storage=*/false, DType::BF16);
  cuda::Decoder gpu(model, kv_pool, 1, 0, cuda::GemmInputs::HiLo);
  SequenceKv kv;
  std::vector<float> got(size_t(n * model.spec.vocab));
  run_sequence(gpu, ids.data(), n, kv, got.data(), true);
  return got;
}

// The prompt of a parity fixture (its reference.json).
std::vector<int32_t> fixture_prompt(const std::string& dir) {
  std::ifstream f(dir + "/reference.json");
  return nlohmann::json::parse(f)["prompt"].get<std::vector<int32_t>>();
}

// How far the serving logits of `prompt` in steps of `step_tokens` move
// when the decoder's switch `var` goes from "1" to "0" (relative_error).
double switch_error(const Model& model, const std::vector<int32_t>& prompt, int64_t step_tokens,
                    const char* var) {
  auto run = [&](const char* value) {
    const ScopedEnv env(var, value);
    return gpu_serving_logits(model, prompt, step_tokens);
  };
  return relative_error(run("1"), run("0"));
}

// The op names of one profiled one-token step of `model` (its first
// prompt token, bf16 KV rows, bf16 GEMM inputs), the decoder made under
// the environment as it is.
std::vector<std::string> one_token_step_ops(const Model& model, int32_t token) {
  KvPool kv_pool = single_sequence_pool(model.spec, 2, 1, /*host_storage=*/false, DType::BF16);
  cuda::Decoder gpu(model, kv_pool, 1, 0, cuda::GemmInputs::Bf16);
  SequenceKv kv;
  EXPECT_TRUE(kv_reserve(kv_pool, model.spec, kv, 1));
  std::vector<float> logits(static_cast<size_t>(model.spec.vocab));
  SeqStep step{&token, 1, &kv, logits.data(), false};
  std::vector<std::string> names;
  for (const auto& op : gpu.profile_step(std::span<const SeqStep>(&step, 1)))
    names.push_back(op.op);
  return names;
}

bool has_op(const std::vector<std::string>& ops, const std::string& name) {
  return std::find(ops.begin(), ops.end(), name) != ops.end();
}

struct WideShape {
  const char* config;
  int64_t head_dim;
};
constexpr WideShape kWideShapes[] = {{"gemma-3-1b", 256}, {"qwen3-1.7b", 128}};

}  // namespace

// The chunked decode kernel's head dims through the decoder, which no parity
// fixture has (their heads are 16 or 32 wide): Gemma 3's attention shape (4
// query heads of dim 256 on one kv head) and Qwen3's (16 of dim 128 on 8): a
// random bf16 checkpoint at that shape (WideHeadsModel) fed 300 tokens one
// per step (graph replays, the chunked kernel with its copies before the PDL
// wait, splits past 128 keys merged in a thread-block cluster and by the
// combine kernel, qkv post inside it and as its own kernel), with bf16 KV
// rows, against the CPU decoder rounding its rows the same way: within 1e-2
// × std, the fixtures' bf16-rows tolerance. Gemma 3's shape also has
// sliding window 64 on layers 0 and 2.
TEST(CudaDecoderWideHeads, OneTokenStepsMatchTheCpuDecoder) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  for (const WideShape shape : kWideShapes) {
    const WideHeadsModel m(shape.config);
    const Model& model = *m.model;
    ASSERT_EQ(model.spec.layer[0].head_dim, shape.head_dim) << shape.config;
    const std::vector<int32_t> ids = wide_heads_prompt();
    const std::vector<float> want = cpu_bf16_rows(model, ids, 0).first;
    // qkv post inside the chunked kernel and as its own kernel, whichever
    // the decoder's rule picks at this shape.
    for (const bool fused : {true, false})
      for (const bool merged : {true, false}) {
        const ScopedEnv post("TANDEM_CUDA_FUSE_QKV_POST", fused ? "1" : "0");
        const ScopedEnv merge("TANDEM_DECODE_CLUSTER_MERGE", merged ? "1" : "0");
        const std::vector<float> got = gpu_one_token_logits(model, ids);
        const double err = relative_error(got, want);
        const std::string how = std::string(fused ? "qkv post fused" : "qkv post unfused") +
                                (merged ? ", splits merged in a cluster" : ", split combine");
        std::printf(
            "[cuda decoder] %s shape, head dim %lld, one token per step, %s: max|gpu - cpu| = "
            "%.2e x std\n",
            shape.config, (long long)shape.head_dim, how.c_str(), err);
        EXPECT_LE(err, 1e-2) << shape.config << ", " << how;
      }
  }
}

// Gemma 4's per-layer block with its glue folded into the kernels beside it
// (TANDEM_CUDA_PLE_TWINS, the default: the MLP's residual add writes h's
// bf16 copy for the per-layer gate's GEMM, the gated activation its own for
// the projection's, and the block's residual add computes the next layer's
// input norm; on skinny-GEMM steps the gate GEMM also applies the activation
// and the per-layer input's product in its epilogue, TANDEM_CUDA_PLE_GATE_TIMES)
// against the separate launches (=0), on both Gemma 4 fixtures under the
// serving numerics: steps of 256 and 16 (bf16 GEMMs, where the twins are
// read; 16 on the skinny GEMM) and of 4 (fused GEMVs, where only the norm
// moves). The bf16 copies
// round as split_bf16 does, so only the norm's summation order may differ:
// within 0.05 x std (a K or V row rounded to the other bf16 neighbour moves
// these tiny random models' logits by up to a few 1e-2). Measured on the
// H200 (steps of 4 and 256): 0 on all four (the fixtures' rows are narrower
// than a thread block, so both norms add in the same order).
TEST(CudaDecoderPle, FoldedGlueMatchesTheSeparateLaunches) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  for (const char* name : {"gemma4_text-bf16", "gemma4-bf16"}) {
    const std::string dir = fixture(name);
    auto model = load_model(dir);
    const std::vector<int32_t> prompt = fixture_prompt(dir);
    for (const int64_t step_tokens : {int64_t(4), int64_t(16), int64_t(256)}) {
      const double err = switch_error(*model, prompt, step_tokens, "TANDEM_CUDA_PLE_TWINS");
      std::printf(
          "[cuda decoder] %s steps of %lld: per-layer glue folded vs separate launches: %.2e x "
          "std\n",
          name, (long long)step_tokens, err);
      EXPECT_LE(err, 0.05) << name << ", steps of " << step_tokens;
    }
  }
}

// Gemma 4's MLP output norm and residual add inside the per-layer gate's
// GEMV (GemvFusion::pre_add without an input norm, the decoder's
// ple_gate_pre_add: TANDEM_CUDA_PLE_GATE_PRE_ADD=1, the default over packed
// gates) against its own residual_norm launch (=0), on both Gemma 4
// fixtures under the serving numerics in steps of 1 and 2 tokens (the
// sandwich steps, where the gate is a GEMV), bf16 and packed 4-bit
// (gemv_affine's quantize kernel adds it there). The fused kernel sums the output's squares in
// another order, so the two may differ by a few f32 ulp of h, which a bf16
// K/V row can turn into a rounding step: within 0.05 x std, as the folded
// glue above — and at 4 bits an int8 activation code (a step of max|x| /
// 127 of its block): within bf16_rows_tolerance, 0.3 x std for these tiny
// random models. Measured on the H100: bf16 3.9e-3 and 8.3e-3, 4-bit
// 2.9e-5 (gemma4_text-bf16) and 0.178 (gemma4-bf16).
TEST(CudaDecoderPle, MlpOutputAddedInThePerLayerGateMatchesItsOwnLaunch) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  for (const char* name : {"gemma4_text-bf16", "gemma4-bf16"})
    for (const int bits : {0, 4}) {
      const std::string dir = fixture(name);
      LoadOptions o;
      o.quantize_bits = bits;
      o.quantize_group_size = 64;
      auto model = load_model(dir, o);
      const std::vector<int32_t> prompt = fixture_prompt(dir);
      // The switch moves the add: the fused gate GEMV runs and the MLP's
      // own residual add does not, or the other way round. 1: over bf16
      // gates too; the default ("packed"): over packed gates only.
      for (const char* fused : {"1", "0", "packed"}) {
        const ScopedEnv env("TANDEM_CUDA_PLE_GATE_PRE_ADD", fused);
        const std::vector<std::string> ops = one_token_step_ops(*model, prompt.front());
        const bool on = fused[0] == '1' || (fused[0] == 'p' && bits == 4);
        EXPECT_EQ(has_op(ops, "ple gate (+ residual, activation)"), on) << name << " " << fused;
        EXPECT_EQ(has_op(ops, "residual + norm"), !on) << name << " " << fused;
      }
      for (const int64_t step_tokens : {int64_t(1), int64_t(2)}) {
        const double err =
            switch_error(*model, prompt, step_tokens, "TANDEM_CUDA_PLE_GATE_PRE_ADD");
        std::printf(
            "[cuda decoder] %s %s steps of %lld: MLP output added in the per-layer gate vs its own "
            "launch: %.2e x std\n",
            name, bits ? "4-bit" : "bf16", (long long)step_tokens, err);
        EXPECT_LE(err, bits ? bf16_rows_tolerance(name) : 0.05)
            << name << (bits ? " 4-bit" : " bf16") << ", steps of " << step_tokens;
      }
    }
}

// The attention kernels' quantized rows through the decoder (quantized_o:
// 4-bit o projections on the GEMV path read them in place of a quantize
// kernel's) at the wide heads' shapes quantized to 4 bits on load, one token
// per step (the chunked kernel writing the rows itself, then, past 128
// keys, the split combine or the cluster's first block, each tried on both
// sides): the logits must be exactly those of the
// decoder that quantizes the f32 attention output with the quantize kernel
// (TANDEM_CUDA_QUANTIZED_O=0), since both give the o GEMV the same bytes —
// and within 0.15 x std of the CPU decoder (int8 activations, bf16 rows):
// measured on the H200 at 2.1e-2 (gemma-3-1b shape) and 7.1e-2 (qwen3-1.7b)
// for both paths alike, where the bf16 model is 7.5e-4 off: a few ulp
// between GPU and CPU that flip a bf16 K/V row or an int8 activation code
// (a step of max|x| / 127 of its block) over 300 positions.
TEST(CudaDecoderWideHeads, QuantizedAttentionRowsGiveTheQuantizeKernelsLogits) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  LoadOptions o;
  o.quantize_bits = 4;
  o.quantize_group_size = 64;
  for (const WideShape shape : kWideShapes) {
    const WideHeadsModel m(shape.config, o);
    const Model& model = *m.model;
    const std::vector<int32_t> ids = wide_heads_prompt();
    const std::vector<float> want = cpu_bf16_rows(model, ids, 0).first;
    // Splits past 128 keys merged by the combine kernel, or in a cluster
    // (whose first block then writes the rows): the same on both sides.
    for (const char* merged : {"0", "1"}) {
      const ScopedEnv merge("TANDEM_DECODE_CLUSTER_MERGE", merged);
      auto run = [&](const char* quantized_o) {
        const ScopedEnv env("TANDEM_CUDA_QUANTIZED_O", quantized_o);
        return gpu_one_token_logits(model, ids);
      };
      const std::vector<float> in_attention = run("1"), by_quantize_kernel = run("0");
      size_t differ = 0;
      for (size_t i = 0; i < in_attention.size(); ++i)
        differ += in_attention[i] != by_quantize_kernel[i];
      const char* how = merged[0] == '1' ? "splits merged in a cluster" : "split combine";
      EXPECT_EQ(differ, 0u) << shape.config << ", " << how << ": logits that differ of "
                            << in_attention.size();
      const double err = relative_error(in_attention, want);
      std::printf(
          "[cuda decoder] %s shape 4-bit, %s, quantized attention rows: %zu logits differ from "
          "the quantize kernel's; max|gpu - cpu| = %.2e x std\n",
          shape.config, how, differ, err);
      EXPECT_LE(err, 0.15) << shape.config << ", " << how;
    }
  }
}

// The prefill attention kernels at those head dims through the decoder: the
// same 300 tokens in steps of 256 under the serving numerics (bf16 KV rows,
// bf16 GEMM inputs), through the hi/lo kernel with bf16 inputs and through
// attention_prefill_bf16 (the default; TANDEM_CUDA_PREFILL_BF16=0, read at
// each launch, sets the hi/lo kernel against it),
// against the CPU decoder rounding its rows and matmul inputs the same way:
// within 0.1 × std, the bf16-GEMM lane's tolerance of the parity test (the
// attention's own bf16 inputs are not modelled on the CPU).
TEST(CudaDecoderWideHeads, PrefillStepsMatchTheCpuDecoder) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  for (const WideShape shape : kWideShapes) {
    const WideHeadsModel m(shape.config);
    const Model& model = *m.model;
    const std::vector<int32_t> ids = wide_heads_prompt();
    const int64_t step_tokens = 256;
    const std::vector<float> want = cpu_bf16_gemm_inputs(model, ids, /*bf16_rows=*/true);
    for (const bool bf16_kernel : {false, true}) {
      std::vector<float> got;
      {
        const ScopedEnv env("TANDEM_CUDA_PREFILL_BF16", bf16_kernel ? "1" : "0");
        got = gpu_serving_logits(model, ids, step_tokens);
      }
      const double err = relative_error(got, want);
      std::printf(
          "[cuda decoder] %s shape, head dim %lld, steps of %lld, %s: max|gpu - cpu| = %.2e x "
          "std\n",
          shape.config, (long long)shape.head_dim, (long long)step_tokens,
          bf16_kernel ? "attention_prefill_bf16" : "hi/lo prefill kernel, bf16 inputs", err);
      EXPECT_LE(err, 0.1) << shape.config
                          << (bf16_kernel ? " attention_prefill_bf16" : " hi/lo prefill kernel");
    }
  }
}

// The bucket a decode step of n sequences replays: powers of two, and from
// 16 also 1.5 times them, so from 16 sequences on at most a third of the
// rows are padding; capped at the step limit. (A host function: it runs
// without a GPU.)
TEST(CudaDecoderBuckets, PowersOfTwoAndHalfAgain) {
  const std::pair<int64_t, int64_t> cases[] = {{1, 1},   {2, 2},   {3, 4},    {5, 8},    {9, 16},
                                               {16, 16}, {17, 24}, {25, 32},  {32, 32},  {33, 48},
                                               {49, 64}, {65, 96}, {97, 128}, {129, 192}};
  for (const auto& [n, bucket] : cases)
    EXPECT_EQ(cuda::Decoder::graph_bucket(n, 1024), bucket) << n << " sequences";
  for (int64_t n = 16; n <= 1000; ++n) {
    const int64_t b = cuda::Decoder::graph_bucket(n, 4096);
    EXPECT_GE(b, n);
    EXPECT_LE(2 * b, 3 * n) << n << " sequences pad more than a third of " << b << " rows";
  }
  EXPECT_EQ(cuda::Decoder::graph_bucket(100, 64), 64);
}

// Steps of 17 to 32 tokens on the skinny GEMM (TANDEM_CUDA_SKINNY_MAX_TOKENS
// =32: three and four 8-token tiles), which no fixture test reaches: the
// wide-heads shapes fed 300 tokens in steps of 32 (the last of 12), with
// bf16 KV rows and GEMM inputs, against the CPU decoder rounding its rows
// and matmul inputs the same way: within the bf16-inputs tolerance of 0.1
// x std.
TEST(CudaDecoderWideHeads, SkinnyStepsOf32MatchTheCpuDecoder) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  const ScopedEnv env("TANDEM_CUDA_SKINNY_MAX_TOKENS", "32");
  for (const WideShape shape : kWideShapes) {
    const WideHeadsModel m(shape.config);
    const Model& model = *m.model;
    const std::vector<int32_t> ids = wide_heads_prompt();
    const int64_t step_tokens = 32;
    const std::vector<float> want = cpu_bf16_gemm_inputs(model, ids, /*bf16_rows=*/true);
    const std::vector<float> got = gpu_serving_logits(model, ids, step_tokens);
    const double err = relative_error(got, want);
    std::printf("[cuda decoder] %s shape, skinny steps of %lld: max|gpu - cpu| = %.2e x std\n",
                shape.config, (long long)step_tokens, err);
    EXPECT_LE(err, 0.1) << shape.config;
  }
}
