#include "backend/cuda/vision_ops.h"

#include <cuda_runtime_api.h>

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

void CudaVisionOps::attention(const float* q, const float* k, const float* v, int64_t n,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                              float* out) {
  if (n <= 0) return;
  // The kernel takes head dims in multiples of 16: pad with zeros (scores
  // and the kept outputs are unchanged).
  const int64_t dp = (head_dim + 15) / 16 * 16;
  if (!attention_prefill_supported(dp, device_))
    fail("%s: the vision attention kernel cannot take head_dim %lld on this device", name(),
         (long long)head_dim);
  VisionBuffer padded;
  const float *qp = q, *kp = k, *vp = v;
  float* op = out;
  if (dp != head_dim) {
    padded = alloc((2 * n * heads + 2 * n * kv_heads) * dp);
    float* base = padded.data();
    pad_rows(q, n * heads, head_dim, dp, base, stream_);
    pad_rows(k, n * kv_heads, head_dim, dp, base + n * heads * dp, stream_);
    pad_rows(v, n * kv_heads, head_dim, dp, base + n * (heads + kv_heads) * dp, stream_);
    qp = base;
    kp = base + n * heads * dp;
    vp = base + n * (heads + kv_heads) * dp;
    op = base + n * (heads + 2 * kv_heads) * dp;
  }
  // The patches as one sequence in one block of keys, every key visible to
  // every patch (key_end = n).
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
  p.head_dim = dp;
  p.scale = scale;
  p.k_base = kp;
  p.v_base = vp;
  p.block_size = 1;
  while (p.block_size < n) p.block_size *= 2;
  attention_prefill(qp, at, dev_tiles, int64_t(tiles.size() / 2), p, op, stream_);
  if (op != out) pad_rows(op, n * heads, dp, head_dim, out, stream_);
  // `positions` and the others were staged by the copies above (pageable
  // host memory is copied out before cudaMemcpyAsync returns).
}

}  // namespace

std::unique_ptr<VisionOps> cuda_vision_ops(int device) {
  return std::make_unique<CudaVisionOps>(device);
}

}  // namespace tandem::cuda
