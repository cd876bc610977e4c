// VisionOps on the CPU: the towers' reference path (backend/cpu kernels).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "model/vision_common.h"
#include "model/vision_ops.h"

namespace tandem {

namespace {

class CpuVisionOps : public VisionOps {
 public:
  explicit CpuVisionOps(ThreadPool& pool) : pool_(pool) {}

  const char* name() const override { return "cpu"; }

  VisionBuffer alloc(int64_t n) override {
    auto v = std::make_shared<std::vector<float>>(size_t(std::max<int64_t>(n, 1)));
    return VisionBuffer(v->data(), n, v);
  }
  void upload(const float* host, int64_t n, float* dst) override { std::copy_n(host, n, dst); }
  void download(const float* src, int64_t n, float* host) override { std::copy_n(src, n, host); }
  void copy(const float* src, int64_t n, float* dst) override { std::copy_n(src, n, dst); }
  const float* param(const std::vector<float>& host) override { return host.data(); }

  void matmul(const float* x, int64_t n, const WeightMatrix& w, const float* bias,
              float* y) override {
    cpu::matmul(pool_, x, n, w, bias, y);
  }
  void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t dim, float eps,
                 float* y) override {
    cpu::layernorm(x, w, b, n, dim, eps, y);
  }
  void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps,
               float* y) override {
    cpu::rmsnorm(x, w, n, dim, eps, y);
  }
  void activate(VisionAct act, float* x, const float* up, int64_t n) override {
    if (up) {
      switch (act) {
        case VisionAct::GeluTanh: cpu::gelu_tanh_mul(x, up, n); break;
        case VisionAct::GeluErf: cpu::gelu_erf_mul(x, up, n); break;
        case VisionAct::SiLU: cpu::silu_mul(x, up, n); break;
      }
      return;
    }
    switch (act) {
      case VisionAct::GeluTanh: cpu::gelu_tanh(x, n); break;
      case VisionAct::GeluErf: cpu::gelu_erf(x, n); break;
      case VisionAct::SiLU:
        for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
        break;
    }
  }
  void add(float* y, const float* x, int64_t n) override { cpu::add_inplace(y, x, n); }
  void clamp(float* x, int64_t n, float lo, float hi) override {
    for (int64_t i = 0; i < n; ++i) x[i] = std::min(std::max(x[i], lo), hi);
  }
  void scale_shift(float* x, int64_t n, int64_t dim, float mul, const float* sub,
                   const float* div) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < dim; ++j) {
        float& e = x[t * dim + j];
        e *= mul;
        if (sub) e = (e - sub[j]) * div[j];
      }
  }
  void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t segments,
            const float* cos, const float* sin) override {
    const int64_t seg = head_dim / segments, half = seg / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int64_t s = 0; s < segments; ++s) {
          float* e = x + (t * heads + hd) * head_dim + s * seg;
          const float* c = cos + t * (head_dim / 2) + s * half;
          const float* sn = sin + t * (head_dim / 2) + s * half;
          for (int64_t i = 0; i < half; ++i) {
            const float a = e[i], b = e[i + half];
            e[i] = a * c[i] - b * sn[i];
            e[i + half] = b * c[i] + a * sn[i];
          }
        }
  }
  void attention(const float* q, const float* k, const float* v, int64_t n, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, float scale, float* out) override {
    vision::full_attention(pool_, q, k, v, n, heads, kv_heads, head_dim, scale, out);
  }
  void pool_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t k,
                 float* y) override {
    const int64_t pc = cols / k;
    std::fill_n(y, (rows / k) * pc * dim, 0.0f);
    for (int64_t t = 0; t < rows * cols; ++t)
      cpu::axpy(1.0f / float(k * k), x + t * dim, y + ((t / cols) / k * pc + (t % cols) / k) * dim,
                dim);
  }
  void merge_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t m,
                  float* y) override {
    const int64_t mr = rows / m, mc = cols / m, M = m * m;
    for (int64_t r = 0; r < mr; ++r)
      for (int64_t c = 0; c < mc; ++c) {
        float* dst = y + (r * mc + c) * dim * M;
        for (int64_t ky = 0; ky < m; ++ky)
          for (int64_t kx = 0; kx < m; ++kx) {
            const float* src = x + ((r * m + ky) * cols + c * m + kx) * dim;
            for (int64_t ch = 0; ch < dim; ++ch) dst[ch * M + ky * m + kx] = src[ch];
          }
      }
  }

 private:
  ThreadPool& pool_;
};

}  // namespace

std::unique_ptr<VisionOps> cpu_vision_ops(ThreadPool& pool) {
  return std::make_unique<CpuVisionOps>(pool);
}

}  // namespace tandem
