// GemmTuner (backend/cuda/gemm_tuner.h), the cuBLASLt algorithm choice of
// the decode graphs' cuBLAS GEMMs: every algorithm it can keep must compute
// y = x · Wᵀ as cublasGemmEx does — against double sums of the same bf16
// operands within 1e-5 · Σ|w·x| + 1e-6 (f32 sums in another order, split-K
// partials included). Skipped, with the reason printed, where no CUDA device
// is usable.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/blas_stream.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cublas_check.h"
#include "backend/cuda/gemm_tuner.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

using namespace tandem;
using namespace tandem::cuda_test;

namespace {

struct Shape {
  int64_t rows, cols, n;
};

// y (n x rows) against double sums of W's rows and x's rows; counts misses.
size_t misses(const std::vector<float>& y, const std::vector<uint16_t>& w,
              const std::vector<uint16_t>& x, const Shape& s, const std::string& what) {
  size_t bad = 0;
  for (int64_t t = 0; t < s.n; ++t)
    for (int64_t r = 0; r < s.rows; ++r) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < s.cols; ++c) {
        const double p = double(bf16_to_f32(w[size_t(r * s.cols + c)])) *
                         double(bf16_to_f32(x[size_t(t * s.cols + c)]));
        sum += p;
        mag += std::fabs(p);
      }
      const float g = y[size_t(t * s.rows + r)];
      if (!(std::fabs(g - sum) <= 1e-5 * mag + 1e-6) && bad++ < 3)
        ADD_FAILURE() << what << " [" << t << ", " << r << "]: " << g << ", want " << sum;
    }
  return bad;
}

}  // namespace

// Untuned shapes are recorded and left to the caller; after tune() (one log
// line a shape), the fastest cuBLASLt algorithm (kept whatever the default's
// time: min_gain below -1) computes the GEMM over every weight matrix
// recorded for the shape, and a graph captured with it replays the same.
TEST(CudaGemmTuner, ChosenAlgorithmsComputeTheGemm) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  const cuda::BlasOnStream blas;
  cuda::GemmTuner tuner(blas.blas, blas.stream, blas.workspace.get(), blas.workspace.bytes(),
                        /*min_gain=*/-2);
  for (const Shape s : {Shape{1000, 512, 40}, Shape{2304, 1152, 64}, Shape{136, 96, 33}}) {
    std::vector<std::vector<uint16_t>> w16;
    std::vector<cuda::DeviceBuffer> dw;
    for (uint32_t copy = 0; copy < 3; ++copy) {
      w16.push_back(to_bf16(random_floats(size_t(s.rows * s.cols), 7 + copy, 0.05f)));
      dw.push_back(upload(w16.back()));
    }
    const auto x16 = to_bf16(random_floats(size_t(s.n * s.cols), 3, 2.f));
    auto dx = upload(x16);
    cuda::DeviceBuffer dy(size_t(s.n * s.rows) * sizeof(float));
    const std::string name =
        std::to_string(s.rows) + "x" + std::to_string(s.cols) + " n=" + std::to_string(s.n);
    for (const auto& w : dw)
      EXPECT_FALSE(tuner.gemm(w.get(), s.rows, s.cols, dx.get(), s.n, dy.as<float>())) << name;
    ASSERT_TRUE(tuner.pending());
    const std::vector<std::string> lines = tuner.tune();
    EXPECT_FALSE(tuner.pending());
    ASSERT_EQ(lines.size(), 1u) << name;
    std::printf("[gemm tuner] %s\n", lines[0].c_str());
    ASSERT_NE(lines[0].find("algorithm #"), std::string::npos) << lines[0];
    for (size_t i = 0; i < dw.size(); ++i) {
      CUDA_CHECK(cudaMemsetAsync(dy.get(), 0xff, dy.bytes(), blas.stream));  // NaNs
      ASSERT_TRUE(tuner.gemm(dw[i].get(), s.rows, s.cols, dx.get(), s.n, dy.as<float>())) << name;
      CUDA_CHECK(cudaStreamSynchronize(blas.stream));
      EXPECT_EQ(misses(download<float>(dy, size_t(s.n * s.rows)), w16[i], x16, s, name), 0u)
          << name << ", matrix " << i;
    }
    // Inside a capture, as the decoder's graphs run it.
    CUDA_CHECK(cudaMemsetAsync(dy.get(), 0xff, dy.bytes(), blas.stream));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(blas.stream, cudaStreamCaptureModeThreadLocal));
    const bool ran = tuner.gemm(dw[1].get(), s.rows, s.cols, dx.get(), s.n, dy.as<float>());
    CUDA_CHECK(cudaStreamEndCapture(blas.stream, &graph));
    ASSERT_TRUE(ran);
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, blas.stream));
    CUDA_CHECK(cudaStreamSynchronize(blas.stream));
    EXPECT_EQ(misses(download<float>(dy, size_t(s.n * s.rows)), w16[1], x16, s, name), 0u)
        << name << ", in a graph";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

// With the default margin, a shape whose default wins is left to the caller
// (gemm() false, its line says "the default"); one whose cuBLASLt algorithm
// wins runs it — either way the caller's result is the GEMM.
TEST(CudaGemmTuner, KeepsTheDefaultUnlessAnAlgorithmWinsByTheMargin) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  const cuda::BlasOnStream blas;
  cuda::GemmTuner tuner(blas.blas, blas.stream, blas.workspace.get(), blas.workspace.bytes());
  const Shape s{4096, 1024, 48};
  const auto w16 = to_bf16(random_floats(size_t(s.rows * s.cols), 11, 0.05f));
  const auto x16 = to_bf16(random_floats(size_t(s.n * s.cols), 12, 2.f));
  auto dw = upload(w16);
  auto dx = upload(x16);
  cuda::DeviceBuffer dy(size_t(s.n * s.rows) * sizeof(float));
  EXPECT_FALSE(tuner.gemm(dw.get(), s.rows, s.cols, dx.get(), s.n, dy.as<float>()));
  const std::vector<std::string> lines = tuner.tune();
  ASSERT_EQ(lines.size(), 1u);
  std::printf("[gemm tuner] %s\n", lines[0].c_str());
  CUDA_CHECK(cudaMemsetAsync(dy.get(), 0xff, dy.bytes(), blas.stream));
  const bool tuned = tuner.gemm(dw.get(), s.rows, s.cols, dx.get(), s.n, dy.as<float>());
  EXPECT_EQ(tuned, lines[0].find("the default") == std::string::npos) << lines[0];
  if (!tuned) {
    const float one = 1.f, zero = 0.f;
    CUBLAS_CHECK(cublasGemmEx(blas.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.rows), int(s.n),
                              int(s.cols), &one, dw.get(), CUDA_R_16BF, int(s.cols), dx.get(),
                              CUDA_R_16BF, int(s.cols), &zero, dy.get(), CUDA_R_32F, int(s.rows),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  CUDA_CHECK(cudaStreamSynchronize(blas.stream));
  EXPECT_EQ(misses(download<float>(dy, size_t(s.n * s.rows)), w16, x16, s, "4096x1024"), 0u);
}
