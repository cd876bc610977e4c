// Each family's image preprocessing, as transformers' image processors do
// it: the target size rule, the resize filter, then rescale and normalize.
//
// The resize happens on 8-bit pixels (resize_image); what follows is an
// affine map per channel, so tests compare the 8-bit images exactly — and
// they are equal to transformers' processors' (tests/test_vision_preprocess).
#pragma once

#include <array>
#include <utility>
#include <vector>

#include "image/image.h"

namespace tandem {

struct Size2 {
  int height = 0;
  int width = 0;
};

// Gemma 3 (SigLIP): a square of `size` pixels, bilinear, aspect not kept.
Size2 gemma3_target_size(int size);

// Pixtral / Mistral 3: scale down (floor) so the longest edge fits
// `longest_edge`, then round each side up to a multiple of `patch_multiple`
// (patch size x spatial merge); bicubic.
Size2 pixtral_target_size(int height, int width, int longest_edge, int patch_multiple);

// Gemma 4: the largest aspect-preserving size whose sides are multiples of
// pooling x patch and which yields at most max_patches patches; bicubic.
// Throws Error for an image too thin to fit.
Size2 gemma4_target_size(int height, int width, int patch_size, int max_patches, int pooling);

// (p / 255 - mean[c]) / std[c] as float [3, H, W].
std::vector<float> normalize_chw(const Image& img, const std::array<float, 3>& mean,
                                 const std::array<float, 3>& std);

// Gemma 4 patches: [rows·cols, P·P·3] in (py, px, c) order, values p / 255.
std::vector<float> patchify(const Image& img, int patch_size);

}  // namespace tandem
