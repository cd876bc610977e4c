// Token sampling on the device (the engine's Sampler contract, see
// engine/sampler.h), so a decode step sends only token ids to the host.
//
// One block per row. Greedy is one argmax pass. Otherwise the kept set of
// top-k, top-p and min-p is a threshold on the row's values, found without
// sorting by a radix select over the values' order-preserving bit keys
// (four passes of 8 bits). Probability mass is summed in 2^-40 fixed point
// with integer atomics, so the same logits and draw give the same token on
// every run. The draw walks the kept tokens in id order (not in probability
// order as the CPU sampler does): the same distribution, a different map
// from the uniform draw to the token.
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr double kFixedOne = 1099511627776.0;  // 2^40: mass fixed point

// Larger floats map to larger keys (NaN excluded by the caller).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned long long fixed_mass(float w) {
  return (unsigned long long)(double(w) * kFixedOne);
}

// Block-wide sum (every thread gets it); `shared` holds kThreads / 32.
__device__ unsigned long long block_sum(unsigned long long v, unsigned long long* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  unsigned long long total = 0;
  for (int i = 0; i < kThreads / 32; ++i) total += shared[i];
  return total;
}

struct Best {
  float v;
  int32_t i;
};
// Larger value wins; lowest id on ties (the CPU argmax).
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__global__ void penalize_kernel(float* __restrict__ logits, int64_t vocab,
                                const SampleRow* __restrict__ rows,
                                const PenaltyToken* __restrict__ tokens, int64_t count) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= count) return;
  const PenaltyToken t = tokens[k];
  const SampleRow& p = rows[t.sample];
  if (t.id < 0 || t.id >= vocab) return;
  float& l = logits[int64_t(p.row) * vocab + t.id];
  if (p.repetition_penalty != 1.f && t.seen)
    l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
  if (t.count > 0) l -= p.presence_penalty + p.frequency_penalty * float(t.count);
}

// State of the sampling of one row, in shared memory.
struct RowState {
  unsigned long long hist[256];
  unsigned long long partial[kThreads / 32];
  Best best[kThreads / 32];
  int nan;
  uint32_t prefix, chosen;
  unsigned long long above;
};

// The largest key K such that the weight of the row's values with key >= K
// (and key >= floor) reaches `target`; weight(value, key) gives each value's
// weight (1 for a count, its fixed-point mass for top-p).
template <class Weight>
__device__ uint32_t select_key(const float* row, int64_t vocab, uint32_t floor,
                               unsigned long long target, Weight weight, RowState& st) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) st.hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = row[i];
      const uint32_t key = order_key(v);
      if (key < floor || (key & mask) != prefix) continue;
      const unsigned long long w = weight(v);
      if (w) atomicAdd(&st.hist[(key >> shift) & 255u], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long acc = above;
      int b = 255;
      for (; b > 0; --b) {
        if (acc + st.hist[b] >= target) break;
        acc += st.hist[b];
      }
      st.above = acc;
      st.chosen = uint32_t(b);
    }
    __syncthreads();
    above = st.above;
    prefix |= st.chosen << shift;
    mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t vocab, const SampleRow* __restrict__ params,
                  int32_t* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ RowState st;
  const SampleRow p = params[blockIdx.x];
  const float* row = logits + int64_t(p.row) * vocab;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) st.nan = 0;
  __syncthreads();

  // Argmax (and NaN detection).
  Best best{-INFINITY, int32_t(vocab)};
  bool nan = false;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (v != v) nan = true;
    best = better(best, Best{v, int32_t(i)});
  }
  if (nan) st.nan = 1;
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)};
    best = better(best, other);
  }
  if (lane == 0) st.best[warp] = best;
  __syncthreads();
  best = st.best[0];
  for (int w = 1; w < kThreads / 32; ++w) best = better(best, st.best[w]);
  if (st.nan || best.i >= vocab) {
    if (threadIdx.x == 0) out[blockIdx.x] = -1;
    return;
  }
  if (p.temperature <= 0.f) {
    if (threadIdx.x == 0) out[blockIdx.x] = best.i;
    return;
  }

  // Weights exp(v / T - max / T), the CPU's float arithmetic.
  const float temp = p.temperature, top = best.v / temp;
  auto mass = [&](float v) { return fixed_mass(expf(v / temp - top)); };
  // min-p keeps weights >= min_p (the top one has weight 1): a key floor.
  uint32_t floor = 0;
  // top-k: the k-th largest value's key.
  if (p.top_k > 0 && int64_t(p.top_k) < vocab)
    floor = select_key(
        row, vocab, 0, (unsigned long long)p.top_k, [](float) { return 1ull; }, st);
  if (p.top_p < 1.f) {
    unsigned long long kept = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
      if (order_key(row[i]) >= floor) kept += mass(row[i]);
    const unsigned long long total = block_sum(kept, st.partial);
    const unsigned long long target = (unsigned long long)(double(p.top_p) * double(total));
    const uint32_t k = select_key(row, vocab, floor, target > 0 ? target : 1, mass, st);
    floor = k > floor ? k : floor;
  }
  auto kept = [&](float v) {
    return order_key(v) >= floor && (p.min_p <= 0.f || expf(v / temp - top) >= p.min_p);
  };

  // The draw: each thread owns a contiguous range of ids; an exclusive scan
  // of the ranges' masses finds the range, then the token, where the
  // cumulative mass passes uniform · total.
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  const int64_t lo = int64_t(threadIdx.x) * chunk, hi = lo + chunk < vocab ? lo + chunk : vocab;
  unsigned long long mine = 0;
  for (int64_t i = lo; i < hi; ++i)
    if (kept(row[i])) mine += mass(row[i]);
  unsigned long long incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) st.partial[warp] = incl;
  __syncthreads();
  unsigned long long before = 0, total = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += st.partial[w];
    total += st.partial[w];
  }
  const unsigned long long excl = before + incl - mine;
  if (total == 0) {  // every kept weight underflowed the fixed point: the top token
    if (threadIdx.x == 0) out[blockIdx.x] = best.i;
    return;
  }
  unsigned long long r = (unsigned long long)(p.uniform * double(total));
  if (r >= total) r = total - 1;
  if (mine > 0 && excl <= r && r < excl + mine) {
    unsigned long long cum = excl;
    for (int64_t i = lo; i < hi; ++i) {
      if (!kept(row[i])) continue;
      cum += mass(row[i]);
      if (cum > r) {
        out[blockIdx.x] = int32_t(i);
        break;
      }
    }
  }
}

}  // namespace

void sample_rows(float* logits, int64_t samples, int64_t vocab, const SampleRow* params,
                 const PenaltyToken* penalties, int64_t penalty_count, int32_t* out,
                 cudaStream_t stream) {
  if (samples <= 0) return;
  if (penalty_count > 0) {
    const unsigned blocks = unsigned((penalty_count + 255) / 256);
    launch(penalize_kernel, blocks, 256, 0, stream, logits, vocab, params, penalties,
           penalty_count);
    CUDA_CHECK(cudaGetLastError());
  }
  launch(sample_kernel, unsigned(samples), kThreads, 0, stream, logits, vocab, params, out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
