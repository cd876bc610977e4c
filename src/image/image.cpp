#include "image/image.h"

#include <webp/decode.h>

#include <cstring>

#include "core/error.h"

// The implementation of stb_image comes from Debian's libstb (-lstb).
#include <stb/stb_image.h>

namespace tandem {

namespace {

bool is_webp(std::span<const uint8_t> b) {
  return b.size() >= 12 && std::memcmp(b.data(), "RIFF", 4) == 0 &&
         std::memcmp(b.data() + 8, "WEBP", 4) == 0;
}

Image decode_webp(std::span<const uint8_t> bytes) {
  int w = 0, h = 0;
  if (!WebPGetInfo(bytes.data(), bytes.size(), &w, &h))
    fail("could not decode the image: corrupt WebP data");
  if (int64_t(w) * h > kMaxImagePixels) fail("the image is too large (%d x %d pixels)", w, h);
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(size_t(w) * size_t(h) * 3);
  if (!WebPDecodeRGBInto(bytes.data(), bytes.size(), img.rgb.data(), img.rgb.size(), w * 3))
    fail("could not decode the image: corrupt WebP data");
  return img;
}

}  // namespace

Image decode_image(std::span<const uint8_t> bytes) {
  if (bytes.empty()) fail("could not decode the image: it is empty");
  if (bytes.size() > size_t(INT32_MAX))
    fail("the image file is too large (%zu bytes)", bytes.size());
  if (is_webp(bytes)) return decode_webp(bytes);
  int w = 0, h = 0, channels = 0;
  if (!stbi_info_from_memory(bytes.data(), int(bytes.size()), &w, &h, &channels))
    fail("could not decode the image: %s (supported: PNG, JPEG, WebP, GIF, BMP)",
         stbi_failure_reason());
  if (w <= 0 || h <= 0) fail("could not decode the image: it has no pixels");
  if (int64_t(w) * h > kMaxImagePixels) fail("the image is too large (%d x %d pixels)", w, h);
  // For GIFs stb_image returns the first frame.
  stbi_uc* pixels = stbi_load_from_memory(bytes.data(), int(bytes.size()), &w, &h, &channels, 3);
  if (!pixels) fail("could not decode the image: %s", stbi_failure_reason());
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.assign(pixels, pixels + size_t(w) * size_t(h) * 3);
  stbi_image_free(pixels);
  return img;
}

std::vector<uint8_t> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;  // '-' and '_': the URL-safe alphabet
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  bool padding = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    const int v = value(c);
    if (v < 0 || padding) fail("invalid base64 data (unexpected character '%c')", c);
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  return out;
}

Image decode_data_url(std::string_view url) {
  if (url.substr(0, 5) != "data:")
    fail("the image URL is not a data: URL (use \"data:image/png;base64,...\")");
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) fail("the image data URL has no ',' before its data");
  const std::string_view meta = url.substr(5, comma - 5);
  if (meta.find(";base64") == std::string_view::npos)
    fail("the image data URL must be base64-encoded (\"data:image/...;base64,...\")");
  if (!meta.empty() && meta.substr(0, 6) != "image/")
    fail("the data URL's media type \"%.*s\" is not an image type", int(meta.size()), meta.data());
  std::vector<uint8_t> bytes = base64_decode(url.substr(comma + 1));
  return decode_image(bytes);
}

}  // namespace tandem
