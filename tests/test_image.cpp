// Image decoding and resizing.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "image/image.h"
#include "image/preprocess.h"
#include "image/resize.h"

// Debian's libstb also carries stb_image_write, used here to make test files.
#include <stb/stb_image_write.h>

using namespace tandem;

namespace {

std::vector<uint8_t> encode_png(int w, int h, int channels, const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> out;
  stbi_write_png_to_func(
      [](void* ctx, void* data, int size) {
        auto* v = static_cast<std::vector<uint8_t>*>(ctx);
        v->insert(v->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
      },
      &out, w, h, channels, pixels.data(), w * channels);
  return out;
}

Image gradient(int w, int h) {
  Image img;
  img.width = w;
  img.height = h;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      img.rgb.push_back(uint8_t(x * 255 / std::max(1, w - 1)));
      img.rgb.push_back(uint8_t(y * 255 / std::max(1, h - 1)));
      img.rgb.push_back(uint8_t((x * 7 + y * 13) % 256));
    }
  return img;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Image, PngRoundTripAndAlphaIsDropped) {
  Image g = gradient(7, 5);
  Image back = decode_image(encode_png(7, 5, 3, g.rgb));
  EXPECT_EQ(back.width, 7);
  EXPECT_EQ(back.height, 5);
  EXPECT_EQ(back.rgb, g.rgb);
  std::vector<uint8_t> rgba = {10, 20, 30, 0, 40, 50, 60, 255};
  Image a = decode_image(encode_png(2, 1, 4, rgba));
  EXPECT_EQ(a.rgb, (std::vector<uint8_t>{10, 20, 30, 40, 50, 60}));
  Image gray = decode_image(encode_png(1, 1, 1, {77}));
  EXPECT_EQ(gray.rgb, (std::vector<uint8_t>{77, 77, 77}));
}

TEST(Image, BrokenInputsAreClearErrors) {
  EXPECT_NE(error_of([] { decode_image({}); }).find("empty"), std::string::npos);
  std::vector<uint8_t> junk = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_NE(error_of([&] { decode_image(junk); }).find("could not decode the image"),
            std::string::npos);
  auto png = encode_png(16, 16, 3, gradient(16, 16).rgb);
  png.resize(png.size() / 2);  // truncated
  EXPECT_NE(error_of([&] { decode_image(png); }).find("could not decode"), std::string::npos);
  std::vector<uint8_t> riff = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P', 1, 2, 3};
  EXPECT_NE(error_of([&] { decode_image(riff); }).find("WebP"), std::string::npos);
}

TEST(Image, DataUrls) {
  auto png = encode_png(3, 2, 3, gradient(3, 2).rgb);
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string b64;
  for (size_t i = 0; i < png.size(); i += 3) {
    uint32_t n = uint32_t(png[i]) << 16 | (i + 1 < png.size() ? uint32_t(png[i + 1]) << 8 : 0) |
                 (i + 2 < png.size() ? png[i + 2] : 0);
    b64 += kAlphabet[(n >> 18) & 63];
    b64 += kAlphabet[(n >> 12) & 63];
    b64 += i + 1 < png.size() ? kAlphabet[(n >> 6) & 63] : '=';
    b64 += i + 2 < png.size() ? kAlphabet[n & 63] : '=';
  }
  Image img = decode_data_url("data:image/png;base64," + b64);
  EXPECT_EQ(img.rgb, gradient(3, 2).rgb);
  EXPECT_NE(error_of([] { decode_data_url("http://example.com/a.png"); }).find("not a data: URL"),
            std::string::npos);
  EXPECT_NE(error_of([] { decode_data_url("data:image/png,abc"); }).find("base64"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { decode_data_url("data:text/plain;base64,aGk="); }).find("not an image type"),
      std::string::npos);
  EXPECT_NE(error_of([] { decode_data_url("data:image/png;base64,a*b"); }).find("invalid base64"),
            std::string::npos);
}

TEST(Resize, ConstantStaysConstantAndIdentityIsExact) {
  Image c;
  c.width = 13;
  c.height = 9;
  c.rgb.assign(13 * 9 * 3, 200);
  for (auto f : {ResizeFilter::Bilinear, ResizeFilter::Bicubic}) {
    Image r = resize_image(c, 5, 20, f);
    EXPECT_EQ(r.width, 5);
    EXPECT_EQ(r.height, 20);
    for (uint8_t v : r.rgb) EXPECT_EQ(v, 200);
  }
  Image g = gradient(8, 8);
  EXPECT_EQ(resize_image(g, 8, 8, ResizeFilter::Bicubic).rgb, g.rgb);
}

TEST(Resize, HalvingAveragesPairsLikePillow) {
  // Bilinear 2x downscale in Pillow: support 2 input pixels each side, weights
  // 1/8, 3/8, 3/8, 1/8 (edges renormalized).
  Image row;
  row.width = 4;
  row.height = 1;
  for (int v : {0, 40, 80, 120})
    row.rgb.insert(row.rgb.end(), {uint8_t(v), uint8_t(v), uint8_t(v)});
  Image r = resize_image(row, 2, 1, ResizeFilter::Bilinear);
  // x=0: weights over inputs 0..2 = 3/8,3/8,1/8 renormalized by 7/8 -> (0*3+40*3+80)/7 = 28.57 ->
  // 29
  EXPECT_EQ(r.rgb[0], 29);
  // x=1: inputs 1..3 with 1/8,3/8,3/8 -> (40+240+360)/7 = 91.4 -> 91
  EXPECT_EQ(r.rgb[3], 91);
}

}  // namespace

namespace {

// The size rules worked by hand from the image processors' formulas (the
// processors' own outputs are compared in test_vision_preprocess.cpp).
TEST(Preprocess, PixtralScalesDownThenRoundsUpToThePatchMultiple) {
  // 64x100 (h x w), longest edge 56: ratio 100/56, floor -> 35x56, up to 28s -> 56x56.
  Size2 s = pixtral_target_size(64, 100, 56, 28);
  EXPECT_EQ(s.height, 56);
  EXPECT_EQ(s.width, 56);
  // Small images are not scaled up, only padded up to the multiple.
  s = pixtral_target_size(23, 61, 1540, 28);
  EXPECT_EQ(s.height, 28);
  EXPECT_EQ(s.width, 84);
}

TEST(Preprocess, Gemma4FillsThePatchBudgetKeepingTheAspect) {
  // 768x768 with E2B's defaults (patch 16, 280 soft tokens x 9 patches, pooling 3):
  // sqrt(2520 * 256 / 589824) = 1.0458 -> floor(803 / 48) * 48 = 768.
  Size2 s = gemma4_target_size(768, 768, 16, 280 * 9, 3);
  EXPECT_EQ(s.height, 768);
  EXPECT_EQ(s.width, 768);
  EXPECT_EQ((s.height / 16) * (s.width / 16) / 9, 256);  // soft tokens, as MODELS.md says
  // A very wide strip: the short side rounds to 0 and gets one 48-pixel row.
  s = gemma4_target_size(10, 4000, 16, 280 * 9, 3);
  EXPECT_EQ(s.height, 48);
  EXPECT_LE((s.height / 16) * (s.width / 16), 280 * 9);
  // Extreme strips are capped at the longest side the budget allows.
  s = gemma4_target_size(1, 1000000, 16, 70 * 9, 3);
  EXPECT_EQ(s.height, 48);
  EXPECT_EQ(s.width, 70 * 48);
}

TEST(Preprocess, NormalizeAndPatchifyLayouts) {
  Image img;
  img.width = 2;
  img.height = 2;
  img.rgb = {0, 255, 51, 255, 0, 102, 51, 102, 0, 102, 51, 255};
  auto chw = normalize_chw(img, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f});
  ASSERT_EQ(chw.size(), 12u);
  EXPECT_FLOAT_EQ(chw[0], -1.0f);   // channel 0, pixel (0, 0)
  EXPECT_FLOAT_EQ(chw[1], 1.0f);    // channel 0, pixel (0, 1)
  EXPECT_FLOAT_EQ(chw[4], 1.0f);    // channel 1, pixel (0, 0)
  auto patches = patchify(img, 2);  // one patch, (py, px, c) order
  ASSERT_EQ(patches.size(), 12u);
  EXPECT_FLOAT_EQ(patches[2], 51.0f / 255.0f);  // (0, 0), blue
  EXPECT_FLOAT_EQ(patches[3], 1.0f);            // (0, 1), red
}

}  // namespace
