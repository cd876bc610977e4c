// A prompt with images, for the models whose vision tower tandem runs
// (Gemma 3 so far): image files -> preprocessing -> vision tower -> soft
// tokens placed over the k-th run of image placeholder ids, with
// bidirectional attention inside each run. Used by `tandem logits/run
// --image`; the server's vision lane comes later.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"

namespace tandem {

struct ImagePrompt {
  std::vector<float> features;       // [images · T, D]
  std::vector<const float*> embeds;  // [n]: a feature row, or null for text tokens
  std::vector<int64_t> key_end;      // [n]: visible keys end (absolute, from position 0)
};

// `ids` must hold one run of the image placeholder per image, each as long
// as the model's tokens per image. Throws Error naming the file, the model
// type, or the expected and found placeholder counts.
ImagePrompt build_image_prompt(const Model& model, ThreadPool& pool,
                               const std::vector<int32_t>& ids,
                               const std::vector<std::string>& image_paths);

}  // namespace tandem
