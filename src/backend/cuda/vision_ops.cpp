#include "backend/cuda/vision_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cublas_check.h"
#include "backend/cuda/device_matrix.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/vision_kernels.h"
#include "core/error.h"

namespace tandem::cuda {

namespace {

// Device memory for one block of attention scores and their softmax.
constexpr size_t kAttentionScratchBytes = size_t(512) << 20;

class CudaVisionOps : public VisionOps {
 public:
  explicit CudaVisionOps(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device_));
    name_ = "cuda:" + std::to_string(device_);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  }
  ~CudaVisionOps() override {
    cudaStreamSynchronize(stream_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return name_.c_str(); }

  VisionBuffer alloc(int64_t n) override {
    CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    CUDA_CHECK(cudaMallocAsync(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(float), stream_));
    cudaStream_t s = stream_;
    return VisionBuffer(static_cast<float*>(p), n,
                        std::shared_ptr<void>(p, [s](void* q) { cudaFreeAsync(q, s); }));
  }
  void upload(const float* host, int64_t n, float* dst) override {
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(dst, host, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
  }
  void download(const float* src, int64_t n, float* host) override {
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(host, src, size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy(const float* src, int64_t n, float* dst) override {
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * 4, cudaMemcpyDeviceToDevice, stream_));
  }
  const float* param(const std::vector<float>& host) override {
    auto it = params_.find(host.data());
    if (it != params_.end()) return it->second.as<float>();
    CUDA_CHECK(cudaSetDevice(device_));
    DeviceBuffer b(std::max<size_t>(host.size(), 1) * sizeof(float));
    if (!host.empty()) b.upload(host.data(), host.size() * sizeof(float));
    return params_.emplace(host.data(), std::move(b)).first->second.as<float>();
  }

  void matmul(const float* x, int64_t n, const WeightMatrix& w, const float* bias,
              float* y) override {
    if (n <= 0) return;
    const DevMatrix& m = weight(w);
    const float one = 1.f, zero = 0.f;
    // Row-major y[n, rows] is column-major yᵀ[rows, n] = W · xᵀ, with W read
    // as the transpose of its column-major [cols, rows] view.
    if (m.dtype == DType::BF16) {
      const size_t elems = size_t(n * m.cols);
      if (split_.bytes() < 2 * elems * sizeof(uint16_t))
        split_ = DeviceBuffer(2 * elems * sizeof(uint16_t));
      uint16_t* hi = split_.as<uint16_t>();
      uint16_t* lo = hi + elems;
      split_bf16(x, int64_t(elems), hi, lo, stream_);
      for (int part = 0; part < 2; ++part)
        CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(m.rows), int(n), int(m.cols),
                                  &one, m.buf.get(), CUDA_R_16BF, int(m.cols), part == 0 ? hi : lo,
                                  CUDA_R_16BF, int(m.cols), part == 0 ? &zero : &one, y, CUDA_R_32F,
                                  int(m.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(m.rows), int(n), int(m.cols),
                               &one, m.buf.as<float>(), int(m.cols), x, int(m.cols), &zero, y,
                               int(m.rows)));
    }
    if (bias) add_bias(y, bias, n, m.rows, stream_);
  }
  void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t dim, float eps,
                 float* y) override {
    cuda::layernorm(x, w, b, n, dim, eps, y, stream_);
  }
  void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps,
               float* y) override {
    if (n > 0) cuda::rmsnorm(x, w, n, dim, eps, y, stream_);
  }
  void activate(VisionAct act, float* x, const float* up, int64_t n) override {
    vision_activate(act == VisionAct::SiLU       ? 0
                    : act == VisionAct::GeluTanh ? 1
                                                 : 2,
                    x, up, n, stream_);
  }
  void add(float* y, const float* x, int64_t n) override {
    if (n > 0) add_inplace(y, x, n, stream_);
  }
  void clamp(float* x, int64_t n, float lo, float hi) override {
    cuda::clamp(x, n, lo, hi, stream_);
  }
  void scale_shift(float* x, int64_t n, int64_t dim, float mul, const float* sub,
                   const float* div) override {
    cuda::scale_shift(x, n, dim, mul, sub, div, stream_);
  }
  void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t segments,
            const float* cos, const float* sin) override {
    rope_table(x, n, heads, head_dim, segments, cos, sin, stream_);
  }
  void attention(const float* q, const float* k, const float* v, int64_t n, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, float scale, float* out) override;
  void flash_attention(const float* q, const float* k, const float* v, int64_t n, int64_t heads,
                       int64_t kv_heads, int64_t head_dim, float scale, float* out);
  void materialized_attention(const float* q, const float* k, const float* v, int64_t n,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                              float* out);
  void pool_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t k,
                 float* y) override {
    cuda::pool_grid(x, rows, cols, dim, k, y, stream_);
  }
  void merge_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t m,
                  float* y) override {
    cuda::merge_grid(x, rows, cols, dim, m, y, stream_);
  }

 private:
  // The device copy of `w`, uploaded the first time (always dense: packed
  // codes would need the decoder's tiled dequantization for every GEMM).
  const DevMatrix& weight(const WeightMatrix& w) {
    auto it = weights_.find(w.data);
    if (it != weights_.end()) return it->second;
    CUDA_CHECK(cudaSetDevice(device_));
    size_t total = 0;
    DevMatrix m = upload_matrix(std::vector<const WeightMatrix*>{&w}, total,
                                /*allow_packed=*/false);
    return weights_.emplace(w.data, std::move(m)).first->second;
  }

  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::unordered_map<const void*, DevMatrix> weights_;
  std::unordered_map<const float*, DeviceBuffer> params_;
  DeviceBuffer split_;  // bf16 hi and lo parts of a matmul's activations
};

// Which attention an image takes, from the H200 (bench_cuda_vision
// --profile): the flash kernel where one pass covers the head dim (64, 128,
// 256: Pixtral's 12100 patches 14.5 ms a layer, against 31 ms with the
// scores materialized; Gemma 4's 2304 patches 0.51 vs 0.57 ms), the
// materialized scores for other head dims, which the flash kernel would
// pad and split into two V passes (SigLIP's 72: 1.7 ms a layer, against
// 4.1 ms padded to 80).
bool flash_takes(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

void CudaVisionOps::attention(const float* q, const float* k, const float* v, int64_t n,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                              float* out) {
  if (n <= 0) return;
  if (flash_takes(head_dim) && attention_prefill_supported(head_dim, device_))
    flash_attention(q, k, v, n, heads, kv_heads, head_dim, scale, out);
  else
    materialized_attention(q, k, v, n, heads, kv_heads, head_dim, scale, out);
}

// The decoder's flash-attention prefill kernel over the patches as one
// sequence in one block of keys, every key visible to every patch (key_end
// = n); head dims of one V pass only (flash_takes).
void CudaVisionOps::flash_attention(const float* q, const float* k, const float* v, int64_t n,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                                    float* out) {
  std::vector<int64_t> positions(static_cast<size_t>(n)), key_end(static_cast<size_t>(n), n);
  std::vector<int32_t> seq(static_cast<size_t>(n), 0);
  for (int64_t t = 0; t < n; ++t) positions[size_t(t)] = t;
  const std::vector<int32_t> tiles = attention_prefill_tiles(seq.data(), n);
  const int32_t zero[2] = {0, 0};
  const size_t bytes = size_t(n) * 16 + size_t(n) * 4 + tiles.size() * 4 + sizeof(zero);
  VisionBuffer layout = alloc(int64_t((bytes + 3) / 4));
  uint8_t* at_base = reinterpret_cast<uint8_t*>(layout.data());
  auto put = [&](const void* src, size_t len) {
    CUDA_CHECK(cudaMemcpyAsync(at_base, src, len, cudaMemcpyHostToDevice, stream_));
    void* where = at_base;
    at_base += len;
    return where;
  };
  StepLayout at;
  at.positions = static_cast<const int64_t*>(put(positions.data(), size_t(n) * 8));
  at.key_end = static_cast<const int64_t*>(put(key_end.data(), size_t(n) * 8));
  at.seq = static_cast<const int32_t*>(put(seq.data(), size_t(n) * 4));
  at.tables = static_cast<const int32_t*>(put(zero, sizeof(zero)));
  at.table_start = at.tables + 1;
  const auto* dev_tiles = static_cast<const int32_t*>(put(tiles.data(), tiles.size() * 4));

  PagedAttention p;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.scale = scale;
  p.k_base = k;
  p.v_base = v;
  p.block_size = 1;
  while (p.block_size < n) p.block_size *= 2;
  attention_prefill(q, at, dev_tiles, int64_t(tiles.size() / 2), p, out, stream_);
  // `positions` and the others were staged by the copies above (pageable
  // host memory is copied out before cudaMemcpyAsync returns).
}

// Scores and outputs of a block of query rows (all heads) at a time through
// cuBLAS: S = q · kᵀ · scale (f32, [heads, rows, n]), P = softmax(S) as
// bf16 hi + lo parts, out = P · v. Each product keeps 16 significant bits
// as the matmuls do: S is one GEMM over q and k as three bf16 parts side by
// side (split_rows3: hi·hi + hi·lo + lo·hi over 3·Dh), so S is written
// once; P · v three GEMMs accumulating into the small output. Blocks of
// rows keep S and P within kAttentionScratchBytes.
void CudaVisionOps::materialized_attention(const float* q, const float* k, const float* v,
                                           int64_t n, int64_t heads, int64_t kv_heads,
                                           int64_t head_dim, float scale, float* out) {
  const int64_t group = heads / kv_heads, Dh = head_dim, Q = heads * Dh, KV = kv_heads * Dh;
  // q and k as (hi, hi, lo) and (hi, lo, hi) rows of 3·Dh; v's hi and lo.
  VisionBuffer parts = alloc((3 * n * Q + 3 * n * KV + 2 * n * KV + 1) / 2);
  uint16_t* qx = reinterpret_cast<uint16_t*>(parts.data());
  uint16_t* kx = qx + 3 * n * Q;
  uint16_t* vh = kx + 3 * n * KV;
  uint16_t* vl = vh + n * KV;
  split_rows3(q, n * heads, Dh, /*lo_second=*/false, qx, stream_);
  split_rows3(k, n * kv_heads, Dh, /*lo_second=*/true, kx, stream_);
  split_bf16(v, n * KV, vh, vl, stream_);

  // S (f32) and P (hi, lo bf16): 8 bytes per score.
  const int64_t rows =
      std::clamp<int64_t>(int64_t(kAttentionScratchBytes / size_t(8 * heads * n)), 1, n);
  VisionBuffer scratch = alloc(2 * heads * rows * n);
  float* S = scratch.data();
  uint16_t* ph = reinterpret_cast<uint16_t*>(S + heads * rows * n);
  uint16_t* pl = ph + heads * rows * n;
  const float zero = 0.f, one = 1.f;
  // Per kv head, its `group` query heads as one batch (k and v shared:
  // stride 0); without grouping, every head in one batch.
  const int64_t batches = group == 1 ? 1 : kv_heads, batch = group == 1 ? heads : group;
  const int64_t shared = group == 1 ? 1 : 0;  // k and v advance per batch entry
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t m = std::min(rows, n - r0);
    // Column-major view: Sᵀ_h (n × m) = Kx_h (n × 3Dh) · Qx_hᵀ (3Dh × m).
    for (int64_t g = 0; g < batches; ++g)
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(3 * Dh), &scale, kx + g * 3 * Dh,
          CUDA_R_16BF, int(3 * KV), shared * 3 * Dh, qx + (r0 * heads + g * group) * 3 * Dh,
          CUDA_R_16BF, int(3 * Q), 3 * Dh, &zero, S + g * group * m * n, CUDA_R_32F, int(n), m * n,
          int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    softmax_rows_split(S, heads * m, n, ph, pl, stream_);
    // Oᵀ_h (Dh × m) = V_hᵀ (Dh × n) · Pᵀ_h (n × m), into out's rows (ld Q).
    for (int64_t g = 0; g < batches; ++g) {
      const uint16_t* a[3] = {vh, vl, vh};
      const uint16_t* b[3] = {ph, ph, pl};
      for (int part = 0; part < 3; ++part)
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(Dh), int(m), int(n), &one, a[part] + g * Dh,
            CUDA_R_16BF, int(KV), shared * Dh, b[part] + g * group * m * n, CUDA_R_16BF, int(n),
            m * n, part == 0 ? &zero : &one, out + r0 * Q + g * group * Dh, CUDA_R_32F, int(Q), Dh,
            int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

}  // namespace

std::unique_ptr<VisionOps> cuda_vision_ops(int device) {
  return std::make_unique<CudaVisionOps>(device);
}

}  // namespace tandem::cuda
