#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Llama 3: long wavelengths are divided by the factor, short ones kept, and
// the band between blended smoothly.
void scale_llama3(const RopeSpec& s, std::vector<float>& inv) {
  if (s.high_freq_factor == s.low_freq_factor)
    fail("llama3 rope: high_freq_factor must differ from low_freq_factor (both %g)",
         s.low_freq_factor);
  const float factor = float(s.factor), lo = float(s.low_freq_factor),
              hi = float(s.high_freq_factor);
  const float old_ctx = float(s.original_max_position);
  const float low_freq_wavelen = old_ctx / lo, high_freq_wavelen = old_ctx / hi;
  for (float& f : inv) {
    float wavelen = 2.0f * float(kPi) / f;
    if (wavelen > low_freq_wavelen) {
      f = f / factor;
    } else if (wavelen >= high_freq_wavelen) {
      float smooth = (old_ctx / wavelen - lo) / (hi - lo);
      f = (1.0f - smooth) * f / factor + smooth * f;
    }
  }
}

// YaRN: interpolate low frequencies, extrapolate high ones, linear ramp between.
void scale_yarn(const RopeSpec& s, int64_t dim, std::vector<float>& inv, float* attention_scaling) {
  const double base = s.theta, factor = s.factor;
  auto correction_dim = [&](double rotations) {
    return (double(dim) * std::log(double(s.original_max_position) / (rotations * 2 * kPi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  for (size_t i = 0; i < inv.size(); ++i) {
    float extrapolated = inv[i];
    float interpolated = float(1.0 / (factor * (1.0 / double(inv[i]))));
    float ramp = std::clamp(float((double(i) - low) / (high - low)), 0.0f, 1.0f);
    float extrapolation_weight = 1.0f - ramp;
    inv[i] = interpolated * (1.0f - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  double af = s.attention_factor;
  if (af == 0.0) af = factor <= 1.0 ? 1.0 : 0.1 * std::log(factor) + 1.0;
  *attention_scaling = float(af);
}

}  // namespace

// Gemma 4's full layers: the first partial_rotary_factor of the head_dim / 2
// frequencies rotate (exponents over the whole head_dim), the rest are zero,
// and the rotation pairs dims across the whole head.
static RopeTable make_proportional_table(const RopeSpec& spec, int64_t head_dim) {
  RopeTable t;
  t.rotary_dim = head_dim;
  const int64_t angles = int64_t(spec.partial_rotary_factor * double(head_dim) / 2.0);
  t.inv_freq.assign(size_t(head_dim / 2), 0.0f);
  for (int64_t i = 0; i < angles && i < head_dim / 2; ++i)
    t.inv_freq[size_t(i)] = 1.0f / std::pow(float(spec.theta), float(2 * i) / float(head_dim));
  if (spec.factor > 0)
    for (float& f : t.inv_freq) f /= float(spec.factor);
  return t;
}

RopeTable make_rope_table(const RopeSpec& spec, int64_t head_dim) {
  if (head_dim > 1024)
    fail("rope: head_dim %lld is larger than the supported 1024", (long long)head_dim);
  if (spec.type == RopeType::Proportional) return make_proportional_table(spec, head_dim);
  RopeTable t;
  t.rotary_dim = int64_t(double(head_dim) * spec.partial_rotary_factor);
  t.rotary_dim -= t.rotary_dim % 2;
  if (t.rotary_dim <= 0 || t.rotary_dim > head_dim)
    fail("rope: partial_rotary_factor %g gives %lld rotary dims for head_dim %lld",
         spec.partial_rotary_factor, (long long)t.rotary_dim, (long long)head_dim);
  const int64_t half = t.rotary_dim / 2;
  t.inv_freq.resize(half);
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in f32
    float exponent = float(2 * i) / float(t.rotary_dim);
    t.inv_freq[i] = 1.0f / std::pow(float(spec.theta), exponent);
  }
  switch (spec.type) {
    case RopeType::Default: break;
    case RopeType::Linear:
      if (spec.factor <= 0) fail("linear rope: factor must be positive, found %g", spec.factor);
      for (float& f : t.inv_freq) f /= float(spec.factor);
      break;
    case RopeType::Llama3: scale_llama3(spec, t.inv_freq); break;
    case RopeType::Yarn: scale_yarn(spec, t.rotary_dim, t.inv_freq, &t.attention_scaling); break;
    case RopeType::Proportional: break;  // handled above
  }
  if (!spec.freq_factors.empty()) {
    if (int64_t(spec.freq_factors.size()) != half)
      fail("rope: %zu frequency factors for %lld rotary frequencies", spec.freq_factors.size(),
           (long long)half);
    for (int64_t i = 0; i < half; ++i) {
      if (!(spec.freq_factors[size_t(i)] > 0.0f))
        fail("rope: frequency factor %lld is %g (must be positive)", (long long)i,
             double(spec.freq_factors[size_t(i)]));
      t.inv_freq[size_t(i)] /= spec.freq_factors[size_t(i)];
    }
  }
  return t;
}

void apply_rope(const RopeTable& table, int64_t pos, float* x, int64_t n_heads, int64_t head_dim) {
  const int64_t half = table.rotary_dim / 2;
  float cos_buf[512], sin_buf[512];  // half of the largest head_dim make_rope_table accepts
  for (int64_t i = 0; i < half; ++i) {
    float angle = float(pos) * table.inv_freq[i];
    cos_buf[i] = std::cos(angle) * table.attention_scaling;
    sin_buf[i] = std::sin(angle) * table.attention_scaling;
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      float a = v[i], b = v[i + half];
      v[i] = a * cos_buf[i] - b * sin_buf[i];
      v[i + half] = b * cos_buf[i] + a * sin_buf[i];
    }
  }
}

}  // namespace tandem
