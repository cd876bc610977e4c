// Decoded images: 8-bit RGB, row-major (H, W, 3).
//
// Contract: decode_image accepts PNG, JPEG, WebP, GIF (first frame) and BMP;
// alpha is dropped the way PIL's convert("RGB") drops it (ignored, not
// blended), grayscale is expanded. Anything else — or a truncated/corrupt
// file, or one over the pixel limit — throws tandem::Error with a message
// meant for an API client ("could not decode the image: ...").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3

  uint8_t at(int y, int x, int c) const {
    return rgb[(size_t(y) * size_t(width) + size_t(x)) * 3 + size_t(c)];
  }
};

// Largest image accepted (pixels); larger ones are refused before decoding.
constexpr int64_t kMaxImagePixels = 64ll * 1024 * 1024;

Image decode_image(std::span<const uint8_t> bytes);

// "data:image/png;base64,...." -> the image. Throws Error for anything that
// is not a base64 data URL of an image.
Image decode_data_url(std::string_view url);

// Standard base64 (RFC 4648, padding optional, whitespace ignored); throws
// Error on other characters.
std::vector<uint8_t> base64_decode(std::string_view text);

}  // namespace tandem
