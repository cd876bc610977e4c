// Image resizing bit-exact with Pillow's Image.resize (and so with
// torchvision's antialiased uint8 resize, which reproduces it): separable
// convolution whose support widens with the downscale factor, 8-bit
// fixed-point weights, horizontal pass first, each pass rounded to 8 bits.
#pragma once

#include "image/image.h"

namespace tandem {

enum class ResizeFilter { Bilinear, Bicubic };

Image resize_image(const Image& src, int out_width, int out_height, ResizeFilter filter);

}  // namespace tandem
