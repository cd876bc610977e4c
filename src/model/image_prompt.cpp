#include "model/image_prompt.h"

#include <bit>
#include <cstdint>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/hash.h"
#include "image/image.h"

namespace tandem {

Image read_image_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read the image %s", path.c_str());
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    return decode_image(bytes);
  } catch (const Error& e) {
    fail("%s: %s", path.c_str(), e.what());
  }
}

std::vector<PreparedImage> prepare_image_files(const VisionTower& tower,
                                               const std::vector<std::string>& image_paths) {
  std::vector<PreparedImage> images;
  for (const std::string& path : image_paths) {
    try {
      images.push_back(tower.prepare(read_image_file(path)));
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.find(path) != std::string::npos) throw;
      fail("%s: %s", path.c_str(), msg.c_str());
    }
  }
  return images;
}

ImagePrompt encode_image_prompt(const VisionTower& tower, ThreadPool& pool,
                                const std::vector<int32_t>& ids,
                                const std::vector<PreparedImage>& images) {
  const int64_t D = tower.text_hidden();
  std::vector<int64_t> tokens;
  int64_t total = 0;
  for (const PreparedImage& img : images) {
    tokens.push_back(img.tokens);
    total += img.tokens;
  }
  ImagePrompt out;
  out.features.resize(size_t(total * D));
  int64_t offset = 0;
  for (const PreparedImage& img : images) {
    tower.encode(pool, img, out.features.data() + offset * D);
    offset += img.tokens;
  }
  out.placement = place_images(tower, ids, tokens, out.features.data());
  return out;
}

namespace {

// Calls f(position, image) for each placeholder of `ids`, images taking them
// in order, `tokens` each; returns how many images got all of theirs.
template <class F>
size_t for_each_placeholder(const std::vector<int32_t>& ids,
                            const std::vector<PreparedImage>& images, int32_t placeholder, F f) {
  size_t k = 0;
  int64_t left = k < images.size() ? images[k].tokens : 0;
  for (size_t i = 0; i < ids.size() && k < images.size(); ++i) {
    if (ids[i] != placeholder) continue;
    f(i, k);
    if (--left == 0 && ++k < images.size()) left = images[k].tokens;
  }
  return k;
}

}  // namespace

std::vector<int64_t> image_token_ends(const std::vector<int32_t>& ids,
                                      const std::vector<PreparedImage>& images,
                                      int32_t placeholder) {
  std::vector<int64_t> ends(images.size(), 0);
  const size_t complete = for_each_placeholder(
      ids, images, placeholder, [&](size_t i, size_t k) { ends[k] = int64_t(i) + 1; });
  if (complete != images.size())
    fail("image_token_ends: the prompt has too few placeholders for its %zu images", images.size());
  return ends;
}

namespace {

// A 64-bit hash of an image as the tower sees it: its grid and pixels.
uint64_t image_hash(const PreparedImage& img) {
  uint64_t h = mix64(uint64_t(img.height) << 32 | uint32_t(img.width));
  h = mix64(h ^ uint64_t(img.rows) ^ (uint64_t(img.tokens) << 24));
  // Two lanes over the pixels' bits, folded: the pixels are megabytes.
  const std::vector<float>& px = img.pixels;
  const size_t n = px.size();
  auto bits = [&](size_t i) { return uint64_t(std::bit_cast<uint32_t>(px[i])); };
  uint64_t a = h, b = ~h;
  size_t i = 0;
  for (; i + 1 < n; i += 2) {
    a = (a ^ bits(i)) * 0x9e3779b97f4a7c15ull;
    b = (b ^ bits(i + 1)) * 0xc2b2ae3d27d4eb4full;
  }
  if (i < n) a = (a ^ bits(i)) * 0x9e3779b97f4a7c15ull;
  return mix64(mix64(a) ^ b ^ n) | 1;  // never 0 (0 means "no image")
}

}  // namespace

std::vector<uint64_t> image_block_salts(const std::vector<int32_t>& ids,
                                        const std::vector<PreparedImage>& images,
                                        int32_t placeholder, int64_t block_size) {
  std::vector<uint64_t> hashes;
  for (const PreparedImage& img : images) hashes.push_back(image_hash(img));
  std::vector<uint64_t> salts(size_t((int64_t(ids.size()) + block_size - 1) / block_size), 0);
  size_t last_block = SIZE_MAX, last_image = SIZE_MAX;
  for_each_placeholder(ids, images, placeholder, [&](size_t i, size_t k) {
    const size_t block = i / size_t(block_size);
    if (block != last_block || k != last_image) {  // each image of a block once, in order
      salts[block] = salts[block] * 0x100000001b3ull ^ hashes[k];
      last_block = block;
      last_image = k;
    }
  });
  return salts;
}

}  // namespace tandem
