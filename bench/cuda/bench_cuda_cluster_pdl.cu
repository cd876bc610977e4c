// Whether a kernel launched after a thread-block cluster launch starts
// early under programmatic dependent launch (PDL), as it does after an
// ordinary launch. Session 42 traced the loss of the attention's cluster
// merge on 8-unit steps to PDL (without PDL the merge wins); the guess is
// that the kernel after a cluster launch gets no early start. This probe
// measures it both ways round. Kernel A triggers its dependents at once and
// spins ~20 µs; kernel B stamps %globaltimer at its entry, before its PDL
// wait, and after the wait. Table 1: A is the cluster launch (`ctas`
// blocks, plain or in clusters of 2 or 4, with or without the chunked
// attention's ~160 KB of shared memory) and B one block an SM (the o GEMV
// after the merged attention). Table 2: A is one block an SM with 0 or
// 120 KB of shared memory and B the cluster launch (the merged attention
// after the q/k/v GEMV; with 120 KB beside 160 KB B cannot fit early).
// Table 3: B's shared memory from 8 to 196 KB behind an A without any
// (session 43: 160 KB waits for A's end, the SM's carveout being set for A).
// Both are captured in a CUDA graph through launch_clustered (the decoder's
// path). Per case, the median over 7 runs of: how long before A's end B's
// first block entered (positive: an early start), and how long after A's
// end B's wait returned.
//
//   bench_cuda_cluster_pdl
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench_util.h"

using namespace tandem;

namespace {

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// stamps: [0] A's last block end, [1] B's first entry, [2] B's first wait return.
__global__ void spinner(unsigned long long* stamps, long long spin) {
  cuda::pdl_launch_dependents();
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  if (threadIdx.x == 0) atomicMax(&stamps[0], now_ns());
}

__global__ void follower(unsigned long long* stamps) {
  const unsigned long long entry = now_ns();
  cuda::pdl_wait();
  const unsigned long long after = now_ns();
  if (threadIdx.x == 0) {
    atomicMin(&stamps[1], entry);
    atomicMin(&stamps[2], after);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Launch {
  int ctas;
  unsigned cluster;
  size_t smem;
};

// Captures A then B in a graph, runs it 7 times and prints one row.
void measure(cudaStream_t stream, cuda::DeviceBuffer& stamps, const Launch& a, const Launch& b,
             const Launch& shown) {
  const long long spin = 40'000;  // clocks: ~20 µs
  auto* st = stamps.as<unsigned long long>();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::launch_clustered(spinner, dim3(unsigned(a.ctas)), dim3(256), a.smem, stream,
                         dim3(a.cluster), st, spin);
  cuda::launch_clustered(follower, dim3(unsigned(b.ctas)), dim3(256), b.smem, stream,
                         dim3(b.cluster), st);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<double> early, after;
  for (int run = 0; run < 7; ++run) {
    CUDA_CHECK(cudaMemsetAsync(st, 0, sizeof(unsigned long long), stream));
    CUDA_CHECK(cudaMemsetAsync(st + 1, 0xff, 2 * sizeof(unsigned long long), stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    unsigned long long s[3];
    stamps.download(s, sizeof s);
    early.push_back((double(s[0]) - double(s[1])) / 1e3);
    after.push_back((double(s[2]) - double(s[0])) / 1e3);
  }
  std::printf("%-6d %-8u %-9zu %16.2f %18.2f\n", shown.ctas, shown.cluster, shown.smem >> 10,
              median(early), median(after));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

}  // namespace

int main() {
  if (!bench::have_device("bench_cuda_cluster_pdl")) return 1;
  if (!cuda::clusters_supported()) {
    std::fprintf(stderr, "bench_cuda_cluster_pdl: clusters and PDL need sm_90 or newer\n");
    return 1;
  }
  cuda::PdlScope pdl(true);
  const int sms = cuda::current_launch_limits().multiprocessors;
  const size_t big_smem = 160 << 10;
  cuda::allow_opt_in_shared_memory(reinterpret_cast<const void*>(spinner));
  cuda::allow_opt_in_shared_memory(reinterpret_cast<const void*>(follower));
  cuda::DeviceBuffer stamps(3 * sizeof(unsigned long long));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const char* header = "%-6s %-8s %-9s %16s %18s\n";
  std::printf("1. A clustered, B one block an SM\n");
  std::printf(header, "A ctas", "cluster", "smem KB", "B early (us)", "B wait after (us)");
  for (int ctas : {2, 32})
    for (unsigned cluster : {1u, 2u, 4u})
      for (size_t smem : {size_t(0), big_smem}) {
        if (unsigned(ctas) % cluster != 0) continue;  // whole clusters only
        const Launch a{ctas, cluster, smem};
        measure(stream, stamps, a, Launch{sms, 1, 0}, a);
      }
  for (size_t a_smem : {size_t(0), size_t(120) << 10}) {
    std::printf("\n2. A one block an SM with %zu KB, B clustered\n", a_smem >> 10);
    std::printf(header, "B ctas", "cluster", "smem KB", "B early (us)", "B wait after (us)");
    for (int ctas : {8, 32})
      for (unsigned cluster : {1u, 2u, 4u})
        for (size_t smem : {size_t(0), big_smem}) {
          const Launch b{ctas, cluster, smem};
          measure(stream, stamps, Launch{sms, 1, a_smem}, b, b);
        }
  }
  // Which shared memory a block may ask for and still enter early behind a
  // kernel that uses none: the carveout that kernel runs with.
  std::printf("\n3. A one block an SM without shared memory, B 32 blocks\n");
  std::printf(header, "B ctas", "cluster", "smem KB", "B early (us)", "B wait after (us)");
  for (size_t kb : {8, 16, 32, 48, 64, 100, 132, 164, 196}) {
    const Launch b{32, 1, kb << 10};
    measure(stream, stamps, Launch{sms, 1, 0}, b, b);
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
