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
// (session 44: every size waits for A's end, the SM's carveout being set for A).
// Table 4: a chain A -> M -> C -> D as in a decode layer (A the down GEMV,
// M the q/k/v GEMV with 16 KB of shared memory, C the chunked attention with
// 160 KB, D the o GEMV without shared memory), each kernel with a carveout
// preference: how early M, C and D enter, and how long D's blocks take to
// reread 48 KB each 16 times (plain loads, so through L1: a longer reread
// means a smaller L1). Session 44 found M entering early only when it
// prefers 0%; the last rows ask whether D still enters early behind C when
// it prefers 0%, and what 0% on every kernel gives (TANDEM_CUDA_CARVEOUT=0
// against TANDEM_CUDA_CARVEOUT_SCOPE=small).
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
// P: a distinct function per carveout preference (the attribute belongs to
// the function; negative: none set), as for link and reread below.
template <int P>
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

// Table 4's kernels. Stamps: [0] A's end; M's entry, wait return, end at
// [1..3]; C's at [4..6]; D's entry and wait return at [7..8] and its
// slowest block's reread (ns) at [9].
constexpr int kStamps = 10;

__device__ __forceinline__ void spin_clocks(long long spin) {
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
}

// Stamps entry, wait return and end at stamps[0..2]. P: the carveout
// preference; ROLE keeps table 4's M (0) and C (1) distinct functions.
template <int P, int ROLE>
__global__ void link(unsigned long long* stamps, long long spin) {
  const unsigned long long entry = now_ns();
  cuda::pdl_launch_dependents();
  cuda::pdl_wait();
  const unsigned long long after = now_ns();
  spin_clocks(spin);
  if (threadIdx.x == 0) {
    atomicMin(&stamps[0], entry);
    atomicMin(&stamps[1], after);
    atomicMax(&stamps[2], now_ns());
  }
}
constexpr int kMiddle = 0, kAttention = 1;

// Rereads this block's 48 KB of `data` 16 times; the slowest block's time
// to stamps[2].
template <int P>
__global__ void reread(unsigned long long* stamps, const float4* data, float* sink) {
  const unsigned long long entry = now_ns();
  cuda::pdl_wait();
  const unsigned long long after = now_ns();
  constexpr int kVecs = (48 << 10) / 16;
  const float4* mine = data + size_t(blockIdx.x) * kVecs;
  float acc = 0.f;
  for (int pass = 0; pass < 16; ++pass)
    for (int i = int(threadIdx.x); i < kVecs; i += int(blockDim.x)) {
      const float4 v = mine[i];
      acc += v.x + v.y + v.z + v.w;
    }
  const unsigned long long took = now_ns() - after;
  if (acc == 12345.f) sink[0] = acc;  // keeps the loads
  if (threadIdx.x == 0) {
    atomicMin(&stamps[0], entry);
    atomicMin(&stamps[1], after);
    atomicMax(&stamps[2], took);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Captures capture(stream)'s launches in a CUDA graph and replays it 7 times, the
// stamps reset to `init` before each (slots kept by atomicMax start at 0,
// by atomicMin at ~0); returns each replay's stamps.
template <class Capture>
std::vector<std::vector<unsigned long long>> replay(cudaStream_t stream, cuda::DeviceBuffer& stamps,
                                                    const std::vector<unsigned long long>& init,
                                                    Capture&& capture) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  capture(stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const size_t bytes = init.size() * sizeof(unsigned long long);
  std::vector<std::vector<unsigned long long>> runs;
  for (int run = 0; run < 7; ++run) {
    stamps.upload(init.data(), bytes);
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    runs.emplace_back(init.size());
    stamps.download(runs.back().data(), bytes);
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return runs;
}

// µs from stamp `from` to stamp `to` (ns) in each run.
std::vector<double> spans(const std::vector<std::vector<unsigned long long>>& runs, int from,
                          int to) {
  std::vector<double> out;
  for (const auto& s : runs) out.push_back((double(s[to]) - double(s[from])) / 1e3);
  return out;
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
  const auto runs = replay(stream, stamps, {0, ~0ull, ~0ull}, [&](cudaStream_t s) {
    cuda::launch_clustered(spinner<-1>, dim3(unsigned(a.ctas)), dim3(256), a.smem, s,
                           dim3(a.cluster), st, spin);
    cuda::launch_clustered(follower, dim3(unsigned(b.ctas)), dim3(256), b.smem, s, dim3(b.cluster),
                           st);
  });
  // B's entry before A's end; B's wait return after it.
  std::printf("%-6d %-8u %-9zu %16.2f %18.2f\n", shown.ctas, shown.cluster, shown.smem >> 10,
              median(spans(runs, 1, 0)), median(spans(runs, 0, 2)));
}

// Sets kernel's carveout preference (negative: leaves it unset).
template <class Kernel>
void prefer(Kernel kernel, int percent) {
  if (percent >= 0)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
}

// One row of table 4: the chain A -> M -> C -> D, each kernel with the
// carveout preference its template argument names (set here).
template <int PA, int PM, int PC, int PD>
void measure_chain(cudaStream_t stream, cuda::DeviceBuffer& stamps, cuda::DeviceBuffer& data,
                   int sms) {
  prefer(spinner<PA>, PA);
  prefer(link<PM, kMiddle>, PM);
  prefer(link<PC, kAttention>, PC);
  prefer(reread<PD>, PD);
  cuda::allow_opt_in_shared_memory(reinterpret_cast<const void*>(link<PC, kAttention>));
  const long long spin = 40'000, short_spin = 10'000;  // clocks: ~20 and ~5 µs
  auto* st = stamps.as<unsigned long long>();
  std::vector<unsigned long long> init(kStamps, ~0ull);
  for (int i : {0, 3, 6, 9}) init[size_t(i)] = 0;
  const auto runs = replay(stream, stamps, init, [&](cudaStream_t s) {
    cuda::launch(spinner<PA>, dim3(unsigned(sms)), dim3(256), 0, s, st, spin);
    cuda::launch(link<PM, kMiddle>, dim3(unsigned(4 * sms)), dim3(256), size_t(16) << 10, s, st + 1,
                 short_spin);
    cuda::launch(link<PC, kAttention>, dim3(32u), dim3(256), size_t(160) << 10, s, st + 4,
                 short_spin);
    cuda::launch(reread<PD>, dim3(unsigned(sms)), dim3(256), 0, s, st + 7, data.as<float4>(),
                 data.as<float>());
  });
  std::vector<double> d_reread;
  for (const auto& r : runs) d_reread.push_back(double(r[9]) / 1e3);
  // M's entry before A's end, C's before M's, D's before C's.
  std::printf("%4d %4d %4d %4d %14.2f %14.2f %14.2f %16.2f\n", PA, PM, PC, PD,
              median(spans(runs, 1, 0)), median(spans(runs, 4, 3)), median(spans(runs, 7, 6)),
              median(d_reread));
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
  cuda::allow_opt_in_shared_memory(reinterpret_cast<const void*>(spinner<-1>));
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
  // The decode layer's chain with carveout preferences (-1: none).
  std::printf(
      "\n4. A (no smem) -> M (4 blocks an SM, 16 KB) -> C (32 blocks, 160 KB) -> D (one block an "
      "SM, rereads 48 KB 16 times), each with a carveout preference (%%; -1: none)\n");
  const char* chain_header = "%4s %4s %4s %4s %14s %14s %14s %16s\n";
  std::printf(chain_header, "A", "M", "C", "D", "M early (us)", "C early (us)", "D early (us)",
              "D reread (us)");
  cuda::DeviceBuffer chain_stamps(kStamps * sizeof(unsigned long long));
  cuda::DeviceBuffer data(size_t(sms) * (48 << 10));
  CUDA_CHECK(cudaMemset(data.get(), 0, size_t(sms) * (48 << 10)));
  measure_chain<-1, -1, -1, -1>(stream, chain_stamps, data, sms);
  measure_chain<-1, 0, -1, -1>(stream, chain_stamps, data, sms);
  measure_chain<-1, 50, -1, -1>(stream, chain_stamps, data, sms);
  measure_chain<-1, 70, -1, -1>(stream, chain_stamps, data, sms);
  measure_chain<-1, 100, -1, -1>(stream, chain_stamps, data, sms);
  // Session 44's next questions: does a kernel preferring 0% still enter
  // early behind the 160 KB one (D), and what does 0% on every kernel give
  // (TANDEM_CUDA_CARVEOUT=0) against 0% on the small-memory kernel only
  // (TANDEM_CUDA_CARVEOUT_SCOPE=small, the second row above)?
  measure_chain<-1, 0, -1, 0>(stream, chain_stamps, data, sms);
  measure_chain<0, 0, 0, 0>(stream, chain_stamps, data, sms);
  measure_chain<-1, -1, -1, -1>(stream, chain_stamps, data, sms);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
