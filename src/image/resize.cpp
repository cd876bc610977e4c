#include "image/resize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double bilinear(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double bicubic(double x) {
  const double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// For each output index: the first input index and the fixed-point weights.
struct Coefficients {
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;  // [out, ksize]
  int ksize = 0;
  int precision = kPrecisionBits;  // fractional bits of the weights
};

Coefficients precompute(int in_size, int out_size, ResizeFilter filter) {
  const double support_base = filter == ResizeFilter::Bilinear ? 1.0 : 2.0;
  const double scale = double(in_size) / double(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = support_base * filterscale;
  Coefficients c;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.first.resize(size_t(out_size));
  c.count.resize(size_t(out_size));
  c.weights.assign(size_t(out_size) * size_t(c.ksize), 0);
  std::vector<double> k(size_t(c.ksize));
  std::vector<double> normalized(size_t(out_size) * size_t(c.ksize), 0.0);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);  // truncation, as Pillow's cast
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = filter == ResizeFilter::Bilinear ? bilinear((x + xmin - center + 0.5) * ss)
                                                        : bicubic((x + xmin - center + 0.5) * ss);
      k[size_t(x)] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) k[size_t(x)] = ww != 0.0 ? k[size_t(x)] / ww : k[size_t(x)];
    std::copy(k.begin(), k.begin() + xmax, normalized.begin() + size_t(xx) * size_t(c.ksize));
    c.first[size_t(xx)] = xmin;
    c.count[size_t(xx)] = xmax;
  }
  // torchvision's uint8 path (what transformers' image processors run)
  // stores weights as int16: as many fractional bits as keep the largest
  // weight of the pass below 2^15. Pillow uses 22 bits; the two differ by at
  // most one step on some pixels.
  double w_max = 0.0;
  for (double w : normalized) w_max = std::max(w_max, w);
  c.precision = 0;
  while (c.precision < kPrecisionBits &&
         int(0.5 + w_max * double(1 << (c.precision + 1))) < (1 << 15))
    ++c.precision;
  for (size_t i = 0; i < normalized.size(); ++i) {
    const double w = normalized[i] * double(1 << c.precision);
    c.weights[i] =
        int32_t(w < 0 ? std::trunc(w - 0.5) : std::trunc(w + 0.5));  // half away from zero
  }
  return c;
}

uint8_t clip8(int32_t v, int precision) {
  v >>= precision;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

Image horizontal(const Image& src, int out_width, ResizeFilter filter) {
  const Coefficients c = precompute(src.width, out_width, filter);
  Image out;
  out.width = out_width;
  out.height = src.height;
  out.rgb.resize(size_t(out_width) * size_t(src.height) * 3);
  for (int y = 0; y < src.height; ++y)
    for (int x = 0; x < out_width; ++x) {
      const int32_t* k = &c.weights[size_t(x) * size_t(c.ksize)];
      for (int ch = 0; ch < 3; ++ch) {
        int32_t ss = 1 << (c.precision - 1);
        for (int i = 0; i < c.count[size_t(x)]; ++i)
          ss += int32_t(src.at(y, c.first[size_t(x)] + i, ch)) * k[i];
        out.rgb[(size_t(y) * size_t(out_width) + size_t(x)) * 3 + size_t(ch)] =
            clip8(ss, c.precision);
      }
    }
  return out;
}

Image vertical(const Image& src, int out_height, ResizeFilter filter) {
  const Coefficients c = precompute(src.height, out_height, filter);
  Image out;
  out.width = src.width;
  out.height = out_height;
  out.rgb.resize(size_t(src.width) * size_t(out_height) * 3);
  for (int y = 0; y < out_height; ++y) {
    const int32_t* k = &c.weights[size_t(y) * size_t(c.ksize)];
    for (int x = 0; x < src.width; ++x)
      for (int ch = 0; ch < 3; ++ch) {
        int32_t ss = 1 << (c.precision - 1);
        for (int i = 0; i < c.count[size_t(y)]; ++i)
          ss += int32_t(src.at(c.first[size_t(y)] + i, x, ch)) * k[i];
        out.rgb[(size_t(y) * size_t(src.width) + size_t(x)) * 3 + size_t(ch)] =
            clip8(ss, c.precision);
      }
  }
  return out;
}

}  // namespace

Image resize_image(const Image& src, int out_width, int out_height, ResizeFilter filter) {
  if (out_width <= 0 || out_height <= 0 || src.width <= 0 || src.height <= 0)
    fail("resize: invalid size %dx%d -> %dx%d", src.width, src.height, out_width, out_height);
  const bool need_h = out_width != src.width, need_v = out_height != src.height;
  if (!need_h && !need_v) return src;
  if (!need_v) return horizontal(src, out_width, filter);
  if (!need_h) return vertical(src, out_height, filter);
  return vertical(horizontal(src, out_width, filter), out_height, filter);
}

}  // namespace tandem
