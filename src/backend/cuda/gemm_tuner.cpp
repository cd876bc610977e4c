#include "backend/cuda/gemm_tuner.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "backend/cuda/check.h"
#include "backend/cuda/cublas_check.h"
#include "core/error.h"

namespace tandem::cuda {

LtGemmShape::LtGemmShape(int64_t rows, int64_t cols, int64_t n) {
  // Column-major, as cuBLAS sees the row-major operands: yᵀ [rows, n] =
  // Wᵀᵀ · xᵀ with W the transpose of its [cols, rows] view.
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, uint64_t(cols), uint64_t(rows), cols));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, uint64_t(cols), uint64_t(n), cols));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, uint64_t(rows), uint64_t(n), rows));
}

LtGemmShape::~LtGemmShape() {
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatmulDescDestroy(desc);
}

std::vector<cublasLtMatmulAlgo_t> LtGemmShape::algorithms(cublasLtHandle_t lt,
                                                          size_t workspace_bytes, int most) const {
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof workspace_bytes));
  std::vector<cublasLtMatmulHeuristicResult_t> offered(size_t(std::max(1, most)));
  int found = 0;
  const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(
      lt, desc, a, b, c, c, pref, int(offered.size()), offered.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> runnable;
  if (asked != CUBLAS_STATUS_SUCCESS) return runnable;  // none for this shape
  for (int i = 0; i < found; ++i)
    if (offered[size_t(i)].state == CUBLAS_STATUS_SUCCESS)
      runnable.push_back(offered[size_t(i)].algo);
  return runnable;
}

// A tuned shape: its cuBLASLt descriptors and the algorithm that won
// (has_algo false: cublasGemmEx's default won), with the times that chose
// it.
struct GemmTuner::Plan {
  LtGemmShape shape;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
  int offered = 0, rank = -1;
  double default_s = 0, best_s = 0;
  Plan(int64_t rows, int64_t cols, int64_t n) : shape(rows, cols, n) {}
};

GemmTuner::GemmTuner(cublasHandle_t blas, cudaStream_t stream, void* workspace,
                     size_t workspace_bytes, double min_gain)
    : blas_(blas),
      stream_(stream),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      min_gain_(min_gain) {
  CUBLAS_CHECK(cublasLtCreate(&lt_));
}

GemmTuner::~GemmTuner() {
  plans_.clear();
  if (lt_) cublasLtDestroy(lt_);
}

bool GemmTuner::gemm(const void* w, int64_t rows, int64_t cols, const void* x, int64_t n,
                     float* y) {
  const Shape shape{rows, cols, n};
  const auto it = plans_.find(shape);
  if (it == plans_.end()) {
    Recorded& r = recorded_[shape];
    if (std::find(r.weights.begin(), r.weights.end(), w) == r.weights.end()) r.weights.push_back(w);
    r.x = x, r.y = y;
    return false;
  }
  const Plan& p = *it->second;
  if (!p.has_algo) return false;
  const float one = 1.f, zero = 0.f;
  const LtGemmShape& g = p.shape;
  CUBLAS_CHECK(cublasLtMatmul(lt_, g.desc, &one, w, g.a, x, g.b, &zero, y, g.c, y, g.c, &p.algo,
                              workspace_, workspace_bytes_, stream_));
  return true;
}

double GemmTuner::time_over(const Recorded& r, const std::function<void(const void*)>& launch_one) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    for (const void* w : r.weights) launch_one(w);
  } catch (const Error&) {  // a candidate that cannot launch: never chosen
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    return std::numeric_limits<double>::infinity();
  }
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(made);
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  // One warm-up replay, then 3 of a model's layers or 8 of a head (~1.5
  // ms a candidate either way at 1B shapes; a 3% margin stands above the
  // noise). With 24 replays of a head, a bucket took 82-102 ms to tune at
  // 24-32 tokens on the H100 (gate/up and the head), 157-195 ms at 128.
  const int reps = std::max(3, int(8 / std::max<size_t>(1, r.weights.size())));
  CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  CUDA_CHECK(cudaEventRecord(t0, stream_));
  for (int i = 0; i < reps; ++i) CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  CUDA_CHECK(cudaEventRecord(t1, stream_));
  CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaGraphExecDestroy(exec);
  return double(ms) * 1e-3 / double(reps) / double(r.weights.size());
}

std::vector<std::string> GemmTuner::tune() {
  std::vector<std::string> lines;
  for (auto& [shape, r] : recorded_) {
    const auto [rows, cols, n] = shape;
    auto plan = std::make_unique<Plan>(rows, cols, n);
    const float one = 1.f, zero = 0.f;
    plan->default_s = time_over(r, [&](const void* w) {
      CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n), int(cols), &one,
                                w, CUDA_R_16BF, int(cols), r.x, CUDA_R_16BF, int(cols), &zero, r.y,
                                CUDA_R_32F, int(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    const LtGemmShape& g = plan->shape;
    const std::vector<cublasLtMatmulAlgo_t> algos =
        g.algorithms(lt_, workspace_bytes_, kCandidates);
    plan->offered = int(algos.size());
    double best = min_gain_ < -1 ? 1e30 : plan->default_s * (1.0 - min_gain_);
    for (size_t i = 0; i < algos.size(); ++i) {
      const cublasLtMatmulAlgo_t* algo = &algos[i];
      const double s = time_over(r, [&](const void* w) {
        CUBLAS_CHECK(cublasLtMatmul(lt_, g.desc, &one, w, g.a, r.x, g.b, &zero, r.y, g.c, r.y, g.c,
                                    algo, workspace_, workspace_bytes_, stream_));
      });
      if (plan->best_s == 0 || s < plan->best_s) plan->best_s = s;
      if (s < best) best = s, plan->algo = *algo, plan->has_algo = true, plan->rank = int(i);
    }
    char line[256];
    std::snprintf(
        line, sizeof line,
        "%lldx%lld n=%lld: cublasGemmEx %.2f us, best of %d cuBLASLt algorithms %.2f "
        "us: %s",
        (long long)rows, (long long)cols, (long long)n, plan->default_s * 1e6, plan->offered,
        plan->best_s * 1e6,
        plan->has_algo ? ("algorithm #" + std::to_string(plan->rank)).c_str() : "the default");
    lines.emplace_back(line);
    plans_[shape] = std::move(plan);
  }
  recorded_.clear();
  return lines;
}

}  // namespace tandem::cuda
