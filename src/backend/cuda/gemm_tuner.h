// cuBLASLt algorithm choice for the decoder's batched decode GEMMs: the
// projections that cuBLAS runs in decode graphs (past the skinny kernel's
// widths: gate/up and the head from 17 tokens, every projection from 33).
// cublasGemmEx takes the heuristic's first algorithm, chosen for the shape
// alone; GemmTuner times that call against every algorithm the cuBLASLt
// heuristic offers for the same GEMM, streaming every weight matrix of the
// shape (a model's layers, several times the L2) as the decode step does,
// and keeps the fastest where it wins by kMinGain.
//
// Use (Decoder::prepare, Decoder::Impl::capture_decode): inside a graph
// capture, gemm() runs a shape's chosen algorithm, or records the call and
// returns false (the caller runs cublasGemmEx); after the capture, when
// pending(), tune() times the recorded shapes (never during a capture) and
// the caller captures again (prepare: captures every bucket first, tunes
// once, keeps no graph). y = x · Wᵀ: W [rows, cols] bf16 row-major, x [n, cols]
// bf16, y [n, rows] f32 — the decoder's GEMM with no output offset.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace tandem::cuda {

// The decoder's GEMM (y[n, rows] = x[n, cols] · W[rows, cols]ᵀ, bf16 in,
// f32 out) as cuBLASLt descriptors, and the algorithms the heuristic offers
// that can run it (up to `most`, within `workspace_bytes`).
struct LtGemmShape {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;

  LtGemmShape(int64_t rows, int64_t cols, int64_t n);
  ~LtGemmShape();
  LtGemmShape(const LtGemmShape&) = delete;
  LtGemmShape& operator=(const LtGemmShape&) = delete;
  std::vector<cublasLtMatmulAlgo_t> algorithms(cublasLtHandle_t lt, size_t workspace_bytes,
                                               int most) const;
};

class GemmTuner {
 public:
  // A chosen algorithm must be this much faster than cublasGemmEx's.
  static constexpr double kMinGain = 0.03;
  // Candidates the heuristic is asked for.
  static constexpr int kCandidates = 32;

  // `blas` runs the default GEMM on `stream` (its stream is set); `workspace`
  // (kept alive by the caller) serves the cuBLASLt calls. min_gain: the
  // fraction by which an algorithm must beat the default (below -1: the
  // fastest cuBLASLt algorithm is kept whatever the default's time — for
  // tests of the cuBLASLt path).
  GemmTuner(cublasHandle_t blas, cudaStream_t stream, void* workspace, size_t workspace_bytes,
            double min_gain = kMinGain);
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // y = x · Wᵀ through the shape's chosen cuBLASLt algorithm: true when one
  // ran. False when the shape is untuned (the call is recorded for tune())
  // or the default won; the caller then runs cublasGemmEx.
  bool gemm(const void* w, int64_t rows, int64_t cols, const void* x, int64_t n, float* y);

  bool pending() const { return !recorded_.empty(); }
  // Times each recorded shape's candidates over the weights recorded for
  // it (outputs land in the recorded y) and keeps the choice; returns one
  // line a shape (both times, the choice) for the log. Synchronizes the
  // stream; must not run during a capture.
  std::vector<std::string> tune();

 private:
  using Shape = std::tuple<int64_t, int64_t, int64_t>;  // rows, cols, n
  struct Plan;
  struct Recorded {
    std::vector<const void*> weights;  // distinct matrices of the shape
    const void* x = nullptr;
    float* y = nullptr;
  };
  // Seconds per matrix of `launch_one` over every recorded weight, replayed
  // as one graph; infinity when a launch fails (tandem::Error).
  double time_over(const Recorded& r, const std::function<void(const void*)>& launch_one);

  cublasHandle_t blas_;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  double min_gain_;
  std::map<Shape, std::unique_ptr<Plan>> plans_;  // tuned: null plan algo = default
  std::map<Shape, Recorded> recorded_;
};

}  // namespace tandem::cuda
