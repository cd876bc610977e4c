// The operations a vision tower's encode is written in, so one encode per
// family runs on the CPU or on a GPU (backend/cuda/vision_ops.h).
//
// Contract: activations are f32 arrays in the backend's memory — host
// memory for the CPU, device memory for CUDA — made by alloc() and filled
// by upload() or by ops. Tower constants (norm weights, biases, position
// tables: vectors the tower owns and never changes after load) enter
// through param(), weights through matmul() as the tower's WeightMatrix;
// a device backend uploads each once, the first time it sees it, and keys
// it by its host address, so both must live as long as the ops object.
// Ops run in the order called; download() waits for them. Every op
// computes in f32 as backend/cpu (ops.h, kernels.h) does, so a device
// backend is tested against the CPU one.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem {

enum class VisionAct { GeluTanh, GeluErf, SiLU };

// f32 scratch in a backend's memory, freed on destruction (movable).
class VisionBuffer {
 public:
  VisionBuffer() = default;
  VisionBuffer(float* data, int64_t size, std::shared_ptr<void> owner)
      : data_(data), size_(size), owner_(std::move(owner)) {}
  float* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
  std::shared_ptr<void> owner_;
};

class VisionOps {
 public:
  virtual ~VisionOps() = default;
  // "cpu" or the device's name (logs, errors).
  virtual const char* name() const = 0;

  virtual VisionBuffer alloc(int64_t n) = 0;
  virtual void upload(const float* host, int64_t n, float* dst) = 0;
  // Waits for every op enqueued so far, then copies n floats to the host.
  virtual void download(const float* src, int64_t n, float* host) = 0;
  virtual void copy(const float* src, int64_t n, float* dst) = 0;
  // The backend's copy of a tower constant (see the contract above).
  virtual const float* param(const std::vector<float>& host) = 0;

  // y[t] = x[t] · Wᵀ (+ bias) for t < n: x [n, w.cols], y [n, w.rows].
  virtual void matmul(const float* x, int64_t n, const WeightMatrix& w, const float* bias,
                      float* y) = 0;
  // Row norms over n rows of dim (in place allowed): LayerNorm with weight
  // and bias; RMSNorm with weight w (null: none), Gemma's +1 already in w.
  virtual void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t dim,
                         float eps, float* y) = 0;
  virtual void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps,
                       float* y) = 0;
  // x[i] = act(x[i]) · up[i] (up null: act(x[i])), i < n.
  virtual void activate(VisionAct act, float* x, const float* up, int64_t n) = 0;
  // y[i] += x[i]
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // x[i] = min(max(x[i], lo), hi), as torch.clamp.
  virtual void clamp(float* x, int64_t n, float lo, float hi) = 0;
  // x[t, j] = (x[t, j] · mul - sub[j]) · div[j] over n rows of dim (sub and
  // div null: x · mul).
  virtual void scale_shift(float* x, int64_t n, int64_t dim, float mul, const float* sub,
                           const float* div) = 0;
  // Rotate-half RoPE in place on x [n, heads, head_dim], whose heads are
  // `segments` equal parts of `seg = head_dim / segments` dims: in part s,
  // dims (s·seg + i, s·seg + i + seg/2), i < seg/2, rotate by the angle
  // whose cos and sin are cos[t, s·seg/2 + i], sin[...] ([n, head_dim/2],
  // backend memory).
  virtual void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t segments,
                    const float* cos, const float* sin) = 0;
  // Bidirectional attention over the n patches of one image: out[t, h] =
  // softmax_j(q[t, h]·k[j, h / (heads / kv_heads)] · scale) v[j, ...].
  // q, out: [n, heads·Dh]; k, v: [n, kv_heads·Dh].
  virtual void attention(const float* q, const float* k, const float* v, int64_t n, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, float scale, float* out) = 0;
  // Mean of each k×k block of a [rows, cols] grid of dim-vectors: y is
  // [(rows/k)·(cols/k), dim], row-major over the pooled grid.
  virtual void pool_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t k,
                         float* y) = 0;
  // Each m×m block of a [rows, cols] grid as one vector y[block, ch·m² +
  // ky·m + kx] = x[(r·m + ky)·cols + c·m + kx, ch] (torch's unfold order);
  // y: [(rows/m)·(cols/m), dim·m²].
  virtual void merge_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t m,
                          float* y) = 0;
};

// The CPU backend over `pool` (kept by reference).
std::unique_ptr<VisionOps> cpu_vision_ops(ThreadPool& pool);

}  // namespace tandem
