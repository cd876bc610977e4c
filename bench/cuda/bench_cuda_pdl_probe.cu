// Whether cuBLAS's GEMM kernels wait on programmatic dependent launch
// (griddepcontrol.wait), i.e. whether a decode graph could let them start
// under the tail of the kernel before them, as every kernel of ours does.
// A producer kernel triggers its dependents at once, spins ~1 ms, then
// writes x = 1 (x was 0); the consumer reads x through a graph edge made
// programmatic after capture. A consumer that waits reads 1 (a GEMM of
// all-ones weights: cols); one that does not reads 0. Our own consumer,
// with and without the wait, shows the probe sees the difference; then
// cublasGemmEx's default and every cuBLASLt heuristic algorithm.
//
//   bench_cuda_pdl_probe          (prints one line a consumer)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/blas_stream.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cublas_check.h"
#include "backend/cuda/gemm_tuner.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench_util.h"

using namespace tandem;

namespace {

__global__ void producer(__nv_bfloat16* x, int n, long long spin) {
  cuda::pdl_launch_dependents();
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) x[i] = __float2bfloat16(1.f);
}

__global__ void consumer(const __nv_bfloat16* x, float* out, bool wait) {
  if (wait) cuda::pdl_wait();
  out[0] = __bfloat162float(x[0]);
}

// Every kernel-to-kernel edge of `g` made programmatic.
void make_programmatic(cudaGraph_t g) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  CUDA_CHECK(cudaGraphGetEdges(g, from.data(), to.data(), nullptr, &n));
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType a, b;
    CUDA_CHECK(cudaGraphNodeGetType(from[i], &a));
    CUDA_CHECK(cudaGraphNodeGetType(to[i], &b));
    if (a != cudaGraphNodeTypeKernel || b != cudaGraphNodeTypeKernel) continue;
    CUDA_CHECK(cudaGraphRemoveDependencies(g, &from[i], &to[i], nullptr, 1));
    cudaGraphEdgeData e{};
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
    CUDA_CHECK(cudaGraphAddDependencies(g, &from[i], &to[i], &e, 1));
  }
}

}  // namespace

int main() {
  if (!bench::have_device("bench_cuda_pdl_probe")) return 1;
  if (!cuda::clusters_supported()) {  // sm_90+: what PDL needs too
    std::fprintf(stderr, "bench_cuda_pdl_probe: PDL needs sm_90 or newer\n");
    return 1;
  }
  const int rows = 4096, cols = 2048, tokens = 32;
  const cuda::BlasOnStream handles;
  cudaStream_t stream = handles.stream;
  const cuda::DeviceBuffer& workspace = handles.workspace;
  cuda::DeviceBuffer w(size_t(rows) * cols * 2), x(size_t(tokens) * cols * 2),
      y(size_t(rows) * tokens * 4), out(4);
  const std::vector<__nv_bfloat16> ones(size_t(rows) * cols, __float2bfloat16(1.f));
  w.upload(ones.data(), w.bytes());
  const long long spin = 2'000'000;  // clocks: ~1 ms

  // What `consume` reads after the producer, through a programmatic edge:
  // the value a waiting consumer sees, or 0.
  auto probe = [&](const std::string& name, const std::function<void()>& consume, bool gemm) {
    CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
    CUDA_CHECK(cudaMemset(y.get(), 0, y.bytes()));
    CUDA_CHECK(cudaMemset(out.get(), 0, out.bytes()));
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    producer<<<1, 256, 0, stream>>>(x.as<__nv_bfloat16>(), tokens * cols, spin);
    consume();
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    make_programmatic(graph);
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    float read = 0;
    (gemm ? y : out).download(&read, sizeof read);
    const bool waited = read == (gemm ? float(cols) : 1.f);
    std::printf("%-46s %s (read %.0f)\n", name.c_str(), waited ? "waits" : "does not wait", read);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  };
  for (bool wait : {true, false})
    probe(
        wait ? "our consumer with griddepcontrol.wait" : "our consumer without it",
        [&] { consumer<<<1, 1, 0, stream>>>(x.as<__nv_bfloat16>(), out.as<float>(), wait); },
        false);
  const float one = 1.f, zero = 0.f;
  probe(
      "cublasGemmEx (default algorithm)",
      [&] {
        CUBLAS_CHECK(cublasGemmEx(handles.blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one,
                                  w.get(), CUDA_R_16BF, cols, x.get(), CUDA_R_16BF, cols, &zero,
                                  y.get(), CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      },
      true);
  const cuda::LtGemmShape g(rows, cols, tokens);
  const std::vector<cublasLtMatmulAlgo_t> algos = g.algorithms(handles.lt, workspace.bytes(), 32);
  for (size_t i = 0; i < algos.size(); ++i)
    probe(
        "cuBLASLt heuristic algorithm #" + std::to_string(i),
        [&] {
          CUBLAS_CHECK(cublasLtMatmul(handles.lt, g.desc, &one, w.get(), g.a, x.get(), g.b, &zero,
                                      y.get(), g.c, y.get(), g.c, &algos[i], workspace.get(),
                                      workspace.bytes(), stream));
        },
        true);
  return 0;
}
