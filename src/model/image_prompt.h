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

// `ids` must hold each image's placeholders (expanded). Throws Error naming
// the file, the model type, or the expected and found placeholder counts.
ImagePrompt build_image_prompt(const Model& model, ThreadPool& pool,
                               const std::vector<int32_t>& ids,
                               const std::vector<std::string>& image_paths);

}  // namespace tandem
