// Each family's image preprocessing against transformers' own image
// processors (tests/fixtures/vision, made by
// tools/fixtures/make_vision_fixtures.py): the processors' pixel tensors,
// mapped back to 8 bits (exactly: their reconstruction error is recorded),
// must equal tandem's resize of the same input image.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "image/image.h"
#include "image/preprocess.h"
#include "image/resize.h"
#include "test_util.h"

using namespace tandem;
using nlohmann::json;

namespace {

std::string dir_of(const std::string& family) {
  return test::source_dir() + "/tests/fixtures/vision/" + family;
}

Image load_png(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return decode_image(bytes);
}

json reference(const std::string& family) {
  std::ifstream f(dir_of(family) + "/reference.json");
  return json::parse(f);
}

struct Mismatch {
  int pixels = 0;     // values that differ at all
  int max_delta = 0;  // largest difference in 8-bit steps
};

Mismatch compare(const Image& a, const Image& b) {
  Mismatch m;
  EXPECT_EQ(a.width, b.width);
  EXPECT_EQ(a.height, b.height);
  if (a.rgb.size() != b.rgb.size()) return {int(a.rgb.size()), 255};
  for (size_t i = 0; i < a.rgb.size(); ++i) {
    int d = std::abs(int(a.rgb[i]) - int(b.rgb[i]));
    if (d) ++m.pixels;
    m.max_delta = std::max(m.max_delta, d);
  }
  return m;
}

void check_family(const std::string& family,
                  const std::function<Image(const Image&, const json&)>& preprocess) {
  json ref = reference(family);
  for (size_t k = 0; k < ref["images"].size(); ++k) {
    EXPECT_LT(ref["images"][k]["max_reconstruction_error"].get<double>(), 1e-3);
    Image input = load_png(dir_of(family) + "/input_" + std::to_string(k) + ".png");
    Image want = load_png(dir_of(family) + "/pixels_" + std::to_string(k) + ".png");
    Image got = preprocess(input, ref);
    Mismatch m = compare(got, want);
    EXPECT_EQ(m.pixels, 0) << family << " image " << k << " (" << input.width << "x" << input.height
                           << "): " << m.pixels << " values differ, by up to " << m.max_delta;
  }
}

TEST(VisionPreprocess, Gemma3MatchesTransformers) {
  check_family("gemma3", [](const Image& img, const json& ref) {
    Size2 s = gemma3_target_size(ref["processor"]["size"].get<int>());
    return resize_image(img, s.width, s.height, ResizeFilter::Bilinear);
  });
}

TEST(VisionPreprocess, Gemma4MatchesTransformers) {
  check_family("gemma4", [](const Image& img, const json& ref) {
    const json& p = ref["processor"];
    const int patch = p["patch_size"], pool = p["pooling_kernel_size"], soft = p["max_soft_tokens"];
    Size2 s = gemma4_target_size(img.height, img.width, patch, soft * pool * pool, pool);
    return resize_image(img, s.width, s.height, ResizeFilter::Bicubic);
  });
}

TEST(VisionPreprocess, PixtralMatchesTransformers) {
  check_family("mistral3", [](const Image& img, const json& ref) {
    const json& p = ref["processor"];
    Size2 s = pixtral_target_size(img.height, img.width, p["longest_edge"], p["patch_multiple"]);
    return resize_image(img, s.width, s.height, ResizeFilter::Bicubic);
  });
}

}  // namespace
