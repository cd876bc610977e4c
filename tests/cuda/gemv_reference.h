// The reference for the decode GEMVs' fusions (cuda::GemvFusion): the same
// math unfused, in double — norm, product, bias, then the gate or the
// residual add — and a bound per output from the magnitudes of its terms.
// Shared by the bf16/f32 tests (test_cuda_kernels.cpp) and the affine ones
// (test_cuda_quant.cpp); the weights come in widened to f32.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"

namespace tandem::cuda_test {

// One fused case on the host; `device` fills a cuda::GemvFusion with the
// device copies of its vectors.
struct HostFusion {
  std::string name;
  bool normalize = false;
  std::vector<float> norm_weight;  // empty: no weight
  std::vector<float> bias;         // empty: none
  bool accumulate = false;         // y starts as `base` (random) and is added to
  cuda::GemvGate gate = cuda::GemvGate::None;
  float eps = 1e-6f;
  // GemvFusion::pre_add: the input is (x + rmsnorm(pre_add) ·
  // pre_add_weight) · pre_add_scale (pre_add: [n, cols], random), also
  // written to residual_out.
  std::vector<float> pre_add, pre_add_weight;
  float pre_add_scale = 1.f;
  // GemvFusion::times: y = times_act(result) · times[t · times_stride + r]
  // (times: kTimesRows rows of times_stride, random).
  std::vector<float> times;
  int64_t times_stride = 0;
  cuda::GemvGate times_act = cuda::GemvGate::None;
};

// Batch rows a case's `times` vector covers (the tests' largest batch).
constexpr int64_t kTimesRows = 16;

// The fusions every GEMV test runs, for a matrix of `rows` x `cols`.
inline std::vector<HostFusion> fusion_cases(int64_t rows, int64_t cols) {
  std::vector<HostFusion> out(5);
  out[0].name = "plain";
  out[1].name = "norm (weighted) + bias + silu gate";
  out[1].normalize = true;
  out[1].norm_weight = random_floats(size_t(cols), 11, 1.f);
  out[1].bias = random_floats(size_t(rows), 12, 0.5f);
  out[1].gate = cuda::GemvGate::SiLU;
  out[2].name = "norm (no weight) + gelu gate";
  out[2].normalize = true;
  out[2].gate = cuda::GemvGate::GeluTanh;
  out[3].name = "bias + accumulate";
  out[3].bias = random_floats(size_t(rows), 13, 0.5f);
  out[3].accumulate = true;
  out[4].name = "norm + accumulate";
  out[4].normalize = true;
  out[4].norm_weight = random_floats(size_t(cols), 14, 1.f);
  out[4].accumulate = true;
  // Gemma 4's per-layer gate: rows of a wider per-token vector (stride).
  HostFusion& times = out.emplace_back();
  times.name = "bias + gelu times a per-token vector";
  times.bias = random_floats(size_t(rows), 19, 0.5f);
  times.times_stride = rows + 5;
  times.times = random_floats(size_t(kTimesRows * times.times_stride), 20, 2.f);
  times.times_act = cuda::GemvGate::GeluTanh;
  if (rows % 2 != 0)  // the gated cases need gate and up halves
    std::erase_if(out, [](const HostFusion& c) { return c.gate != cuda::GemvGate::None; });
  return out;
}

// The sandwich-norm cases (GemvFusion::pre_add) for n batch rows of `cols`:
// gemv_bf16 (cols % 8 == 0, n ≤ kGemvPreAddMaxRows) and gemv_affine. The
// first is gated (left out for odd rows); the last has no input norm.
inline std::vector<HostFusion> pre_add_cases(int64_t rows, int64_t cols, int64_t n) {
  std::vector<HostFusion> out(3);
  out[0].name = "pre_add + norm + gelu gate";
  out[0].gate = cuda::GemvGate::GeluTanh;
  out[1].name = "pre_add + norm + bias";
  out[1].bias = random_floats(size_t(rows), 15, 0.5f);
  out[2].name = "pre_add scaled (Gemma 4's layer scalar) + norm";
  out[2].pre_add_scale = 0.37f;
  for (HostFusion& f : out) {
    f.normalize = true;
    f.norm_weight = random_floats(size_t(cols), 16, 1.f);
  }
  // Gemma 4's per-layer gate after the MLP's output norm and residual add:
  // the product takes h' itself, and its activation times a per-token vector.
  HostFusion& times = out.emplace_back();
  times.name = "pre_add, no norm, gelu times a per-token vector";
  times.times_stride = rows + 3;
  times.times = random_floats(size_t(kTimesRows * times.times_stride), 21, 2.f);
  times.times_act = cuda::GemvGate::GeluTanh;
  for (HostFusion& f : out) {
    f.pre_add = random_floats(size_t(n * cols), 17, 3.f);
    f.pre_add_weight = random_floats(size_t(cols), 18, 1.f);
  }
  if (rows % 2 != 0) out.erase(out.begin());
  return out;
}

// Device copies of a case's vectors, alive as long as the GemvFusion.
struct DeviceFusion {
  cuda::DeviceBuffer norm_weight, bias, pre_add, pre_add_weight, residual_out, times;
  cuda::GemvFusion fusion;
  explicit DeviceFusion(const HostFusion& h) {
    fusion.normalize = h.normalize;
    fusion.norm_eps = h.eps;
    fusion.accumulate = h.accumulate;
    fusion.gate = h.gate;
    if (!h.norm_weight.empty()) {
      norm_weight = upload(h.norm_weight);
      fusion.norm_weight = norm_weight.as<float>();
    }
    if (!h.bias.empty()) {
      bias = upload(h.bias);
      fusion.bias = bias.as<float>();
    }
    if (!h.pre_add.empty()) {
      pre_add = upload(h.pre_add);
      pre_add_weight = upload(h.pre_add_weight);
      residual_out = upload(std::vector<float>(h.pre_add.size(), 0.f));
      fusion.pre_add = pre_add.as<float>();
      fusion.pre_add_weight = pre_add_weight.as<float>();
      fusion.residual_out = residual_out.as<float>();
      fusion.pre_add_scale = h.pre_add_scale;
    }
    if (!h.times.empty()) {
      times = upload(h.times);
      fusion.times = times.as<float>();
      fusion.times_stride = h.times_stride;
      fusion.times_act = h.times_act;
    }
  }
};

// The input row t as the fused GEMV sees it: x, or (x + rmsnorm(pre_add) ·
// pre_add_weight) · pre_add_scale (double).
inline std::vector<double> fused_input(const std::vector<float>& x, int64_t t, int64_t cols,
                                       const HostFusion& f) {
  std::vector<double> in(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) in[size_t(c)] = x[size_t(t * cols + c)];
  if (f.pre_add.empty()) return in;
  double ss = 0;
  for (int64_t c = 0; c < cols; ++c)
    ss += double(f.pre_add[size_t(t * cols + c)]) * f.pre_add[size_t(t * cols + c)];
  const double s1 = 1.0 / std::sqrt(ss / double(cols) + f.eps);
  for (int64_t c = 0; c < cols; ++c)
    in[size_t(c)] =
        (in[size_t(c)] + s1 * f.pre_add[size_t(t * cols + c)] * f.pre_add_weight[size_t(c)]) *
        f.pre_add_scale;
  return in;
}

// residual_out of a pre_add case against fused_input: f32 products and a
// sum, 1e-6 of the terms' magnitudes.
inline void expect_residual_out(const std::vector<float>& got, const std::vector<float>& x,
                                int64_t n, int64_t cols, const HostFusion& f,
                                const std::string& what) {
  int bad = 0;
  for (int64_t t = 0; t < n; ++t) {
    const auto want = fused_input(x, t, cols, f);
    for (int64_t c = 0; c < cols; ++c) {
      const double w = want[size_t(c)],
                   bound = 1e-6 * (std::fabs(w) + std::fabs(x[size_t(t * cols + c)]) + 1.0);
      const double v = got[size_t(t * cols + c)];
      if (!(std::fabs(v - w) <= bound) && bad++ < 3)
        ADD_FAILURE() << what << " residual_out [" << t << ", " << c << "]: gpu " << v << " want "
                      << w;
    }
  }
  EXPECT_EQ(bad, 0) << what << " residual_out";
}

inline double act(cuda::GemvGate g, double v) {
  if (g == cuda::GemvGate::SiLU) return v / (1.0 + std::exp(-v));
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

// An activation row as the int8 GEMVs see it (the CPU's method,
// backend/cpu/kernels_quant.h): each block of 32 values becomes q · d with
// d = max|x| / 127 and q = round(x · 127 / max|x|), in the kernels' f32
// arithmetic. slack[c] is d where x · 127 / max|x| lies within 1e-3 of a
// rounding tie (an input a few ulp away — the GPU's norm summed in another
// order — may round the other way there), else 0.
struct QuantizedRow {
  std::vector<double> value, slack;
};
inline QuantizedRow quantize_row(const std::vector<double>& x) {
  QuantizedRow out{std::vector<double>(x.size()), std::vector<double>(x.size(), 0.0)};
  for (size_t b = 0; b + 32 <= x.size(); b += 32) {
    float amax = 0.f;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(float(x[i])));
    const float id = amax > 0.f ? 127.0f / amax : 0.f, d = amax / 127.0f;
    for (size_t i = b; i < b + 32; ++i) {
      const float v = float(x[i]) * id;
      out.value[i] = double(std::nearbyint(v)) * double(d);
      if (std::fabs(std::fabs(v - std::trunc(v)) - 0.5f) < 1e-3f) out.slack[i] = d;
    }
  }
  return out;
}

// Checks `got` ([n, outputs]) against the unfused math over the widened
// weights W ([rows, cols]) and x ([n, cols]); `base` is y before the call
// (accumulate). f32 sums in another order: 1e-5 of Σ|w·x| per product; the
// norm's scale, fast-math exp/tanh: 2e-6 of the output (pre_add: 1e-5, its
// sum of squares comes from three f32 sums); the gate passes a product's
// error on times |up| (the activations' slope is below 1.2). int8_acts: the
// GEMV quantizes its (normalized) input rows first (quantize_row), and the
// reference does too, allowing |w| · slack where a value sits at a tie.
inline void expect_fused_gemv(const std::vector<float>& got, const std::vector<float>& W,
                              int64_t rows, int64_t cols, const std::vector<float>& x, int64_t n,
                              const HostFusion& f, const std::vector<float>& base,
                              const std::string& what, bool int8_acts = false) {
  const bool gated = f.gate != cuda::GemvGate::None;
  const int64_t outputs = gated ? rows / 2 : rows;
  ASSERT_EQ(got.size(), size_t(n * outputs)) << what;
  int bad = 0;
  std::vector<double> dot(static_cast<size_t>(rows)), mag(static_cast<size_t>(rows));
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> xt = fused_input(x, t, cols, f);
    double scale = 1.0;
    if (f.normalize) {
      double ss = 0;
      for (int64_t c = 0; c < cols; ++c) ss += xt[size_t(c)] * xt[size_t(c)];
      scale = 1.0 / std::sqrt(ss / double(cols) + f.eps);
    }
    std::vector<double> in(static_cast<size_t>(cols)), slack(static_cast<size_t>(cols), 0.0);
    for (int64_t c = 0; c < cols; ++c) {
      in[size_t(c)] = xt[size_t(c)];
      if (f.normalize)
        in[size_t(c)] *= scale * (f.norm_weight.empty() ? 1.0 : f.norm_weight[size_t(c)]);
    }
    if (int8_acts) {
      QuantizedRow q = quantize_row(in);
      in = std::move(q.value);
      slack = std::move(q.slack);
    }
    for (int64_t r = 0; r < rows; ++r) {
      double d = 0, m = 0, tie = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double wv = W[size_t(r * cols + c)], p = wv * in[size_t(c)];
        d += p;
        m += std::fabs(p);
        tie += std::fabs(wv) * slack[size_t(c)];
      }
      dot[size_t(r)] = d + (f.bias.empty() ? 0.0 : f.bias[size_t(r)]);
      mag[size_t(r)] = 1e-5 * m + tie + 1e-6;
    }
    for (int64_t o = 0; o < outputs; ++o) {
      double want, bound;
      if (gated) {
        const double g = dot[size_t(o)], u = dot[size_t(outputs + o)];
        want = act(f.gate, g) * u;
        bound = 1.2 * std::fabs(u) * mag[size_t(o)] +
                std::fabs(act(f.gate, g)) * mag[size_t(outputs + o)];
      } else if (!f.times.empty()) {
        const double m = f.times[size_t(t * f.times_stride + o)];
        want = act(f.times_act, dot[size_t(o)]) * m;
        bound = 1.2 * std::fabs(m) * mag[size_t(o)];
      } else {
        const double b = f.accumulate ? base[size_t(t * rows + o)] : 0.0;
        want = b + dot[size_t(o)];
        bound = mag[size_t(o)] + 1e-6 * std::fabs(b);
      }
      bound += (f.pre_add.empty() ? 2e-6 : 1e-5) * std::fabs(want) + 1e-6;
      const double v = got[size_t(t * outputs + o)];
      if (!(std::fabs(v - want) <= bound) && bad++ < 3)
        ADD_FAILURE() << what << " [" << t << ", " << o << "]: gpu " << v << " want " << want
                      << " (bound " << bound << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace tandem::cuda_test
