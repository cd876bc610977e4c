#include "image/preprocess.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

Size2 gemma3_target_size(int size) {
  return {size, size};
}

Size2 pixtral_target_size(int height, int width, int longest_edge, int patch_multiple) {
  const double ratio = std::max(double(height) / longest_edge, double(width) / longest_edge);
  if (ratio > 1.0) {
    height = int(std::floor(height / ratio));
    width = int(std::floor(width / ratio));
  }
  auto round_up = [&](int v) {
    return ((std::max(v, 1) - 1) / patch_multiple + 1) * patch_multiple;
  };
  return {round_up(height), round_up(width)};
}

Size2 gemma4_target_size(int height, int width, int patch_size, int max_patches, int pooling) {
  const double total = double(height) * double(width);
  const double target_px = double(max_patches) * patch_size * patch_size;
  const double factor = std::sqrt(target_px / total);
  const int side = pooling * patch_size;
  int th = int(std::floor(factor * height / side)) * side;
  int tw = int(std::floor(factor * width / side)) * side;
  if (th == 0 && tw == 0)
    fail("the image (%dx%d) is too small to resize for this model", width, height);
  const int max_side = (max_patches / (pooling * pooling)) * side;
  if (th == 0) {
    th = side;
    tw = std::min(int(std::floor(double(width) / height)) * side, max_side);
  } else if (tw == 0) {
    tw = side;
    th = std::min(int(std::floor(double(height) / width)) * side, max_side);
  }
  if (double(th) * tw > target_px)
    fail("the image's aspect ratio (%dx%d) is too extreme for this model's patch budget", width,
         height);
  return {th, tw};
}

std::vector<float> normalize_chw(const Image& img, const std::array<float, 3>& mean,
                                 const std::array<float, 3>& std) {
  const size_t hw = size_t(img.width) * size_t(img.height);
  std::vector<float> out(3 * hw);
  for (int c = 0; c < 3; ++c)
    for (size_t i = 0; i < hw; ++i)
      out[size_t(c) * hw + i] =
          (float(img.rgb[i * 3 + size_t(c)]) * (1.0f / 255.0f) - mean[c]) / std[c];
  return out;
}

std::vector<float> patchify(const Image& img, int p) {
  if (img.width % p != 0 || img.height % p != 0)
    fail("patchify: %dx%d is not a multiple of the patch size %d", img.width, img.height, p);
  const int rows = img.height / p, cols = img.width / p;
  std::vector<float> out;
  out.reserve(size_t(img.width) * size_t(img.height) * 3);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      for (int y = 0; y < p; ++y)
        for (int x = 0; x < p; ++x)
          for (int ch = 0; ch < 3; ++ch)
            out.push_back(float(img.at(r * p + y, c * p + x, ch)) * (1.0f / 255.0f));
  return out;
}

}  // namespace tandem
