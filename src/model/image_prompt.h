// A prompt with images for `tandem logits/run --image`: image files ->
// the tower's preprocessing and encoder -> soft tokens placed over the
// prompt's placeholder ids (model/vision_tower.h), as the server's vision
// lane places them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "model/vision_tower.h"

namespace tandem {

struct ImagePrompt {
  std::vector<float> features;  // [soft tokens of all images, D]
  ImagePlacement placement;     // embeds / key_end per prompt token
};

// Reads and decodes an image file; Error names the file.
Image read_image_file(const std::string& path);

// Reads and prepares image files with `tower`; Error names the file.
std::vector<PreparedImage> prepare_image_files(const VisionTower& tower,
                                               const std::vector<std::string>& image_paths);

// Encodes prepared images and places them over `ids`, which must hold each
// image's placeholders (expanded). Throws Error with the expected and found
// placeholder counts.
ImagePrompt encode_image_prompt(const VisionTower& tower, ThreadPool& pool,
                                const std::vector<int32_t>& ids,
                                const std::vector<PreparedImage>& images);

// For the prefix cache (model/kv_pool.h), images take the placeholders of
// `ids` in order, `tokens` each. The end of each image's placeholders (one
// past its last), in prompt positions.
std::vector<int64_t> image_token_ends(const std::vector<int32_t>& ids,
                                      const std::vector<PreparedImage>& images,
                                      int32_t placeholder);
// PrefixTokens::salts of such a prompt: per block of `block_size` tokens, a
// hash of the images (pixels and grid) whose placeholders it holds, 0 where
// none.
std::vector<uint64_t> image_block_salts(const std::vector<int32_t>& ids,
                                        const std::vector<PreparedImage>& images,
                                        int32_t placeholder, int64_t block_size);

}  // namespace tandem
