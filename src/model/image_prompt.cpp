#include "model/image_prompt.h"

#include <fstream>
#include <iterator>

#include "core/error.h"
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

}  // namespace tandem
