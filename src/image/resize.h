// Image resizing bit-exact with torchvision's antialiased uint8 resize, the
// one transformers' image processors run: Pillow's algorithm (separable
// convolution whose support widens with the downscale factor, horizontal
// pass first, each pass rounded to 8 bits) with int16 fixed-point weights
// whose precision is the most that keeps the largest weight below 2^15
// (Pillow itself uses 22 bits and differs by one step on a few pixels).
// Tested against the Gemma 3, Gemma 4 and Pixtral processors' outputs.
#pragma once

#include "image/image.h"

namespace tandem {

enum class ResizeFilter { Bilinear, Bicubic };

Image resize_image(const Image& src, int out_width, int out_height, ResizeFilter filter);

}  // namespace tandem
