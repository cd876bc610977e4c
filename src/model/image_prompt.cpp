#include "model/image_prompt.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "image/image.h"
#include "image/preprocess.h"
#include "image/resize.h"
#include "model/vision_gemma3.h"

namespace tandem {

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("cannot read %s", path.c_str());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON: %s", path.c_str(), e.what());
  }
}

Image read_image(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read the image %s", path.c_str());
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    return decode_image(bytes);
  } catch (const Error& e) {
    fail("%s: %s", path.c_str(), e.what());
  }
}

// Mean and std of the model's image processor (preprocessor_config.json),
// Gemma 3's 0.5 / 0.5 when the folder has none.
void normalization(const std::string& dir, std::array<float, 3>& mean, std::array<float, 3>& std) {
  mean = {0.5f, 0.5f, 0.5f};
  std = {0.5f, 0.5f, 0.5f};
  const std::string path = dir + "/preprocessor_config.json";
  if (!std::filesystem::exists(path)) return;
  nlohmann::json p = read_json(path);
  for (int c = 0; c < 3; ++c) {
    if (p.contains("image_mean") && p["image_mean"].is_array())
      mean[c] = p["image_mean"][c].get<float>();
    if (p.contains("image_std") && p["image_std"].is_array())
      std[c] = p["image_std"][c].get<float>();
  }
}

}  // namespace

ImagePrompt build_image_prompt(const Model& model, ThreadPool& pool,
                               const std::vector<int32_t>& ids,
                               const std::vector<std::string>& image_paths) {
  const std::string dir = model.checkpoint.dir();
  nlohmann::json config = read_json(dir + "/config.json");
  const std::string type = config.value("model_type", "");
  if (type != "gemma3")
    fail(
        "%s: images are supported for Gemma 3 checkpoints so far (model_type \"gemma3\"), not "
        "\"%s\"",
        dir.c_str(), type.c_str());
  const int32_t placeholder =
      config.value("image_token_index", config.value("image_token_id", 262144));
  auto vision = Gemma3Vision::load(model.checkpoint, config, model.spec.hidden);
  const int64_t T = vision->tokens_per_image(), D = model.spec.hidden, S = vision->image_size();

  // Runs of placeholders, in order.
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end)
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == placeholder && (i == 0 || ids[i - 1] != placeholder)) {
      size_t j = i;
      while (j < ids.size() && ids[j] == placeholder) ++j;
      runs.emplace_back(i, j);
    }
  if (runs.size() != image_paths.size())
    fail("the prompt has %zu runs of the image placeholder (id %d) but %zu images were given",
         runs.size(), placeholder, image_paths.size());
  for (size_t k = 0; k < runs.size(); ++k)
    if (int64_t(runs[k].second - runs[k].first) != T)
      fail("image %zu: its placeholder run has %zu tokens, the model needs %lld per image", k + 1,
           runs[k].second - runs[k].first, (long long)T);

  std::array<float, 3> mean, std;
  normalization(dir, mean, std);
  ImagePrompt out;
  out.features.resize(size_t(int64_t(image_paths.size()) * T * D));
  for (size_t k = 0; k < image_paths.size(); ++k) {
    const Image img = read_image(image_paths[k]);
    const Size2 size = gemma3_target_size(int(S));
    const std::vector<float> pixels = normalize_chw(
        resize_image(img, size.width, size.height, ResizeFilter::Bilinear), mean, std);
    vision->encode(pool, pixels.data(), out.features.data() + int64_t(k) * T * D);
  }
  out.embeds.assign(ids.size(), nullptr);
  out.key_end.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out.key_end[i] = int64_t(i) + 1;
  for (size_t k = 0; k < runs.size(); ++k)
    for (size_t i = runs[k].first; i < runs[k].second; ++i) {
      out.embeds[i] = out.features.data() + (int64_t(k) * T + int64_t(i - runs[k].first)) * D;
      out.key_end[i] = int64_t(runs[k].second);  // bidirectional within the image
    }
  return out;
}

}  // namespace tandem
