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
#include "model/vision_pixtral.h"

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
// the family's defaults when the folder has none.
void normalization(const std::string& dir, std::array<float, 3>& mean, std::array<float, 3>& std,
                   const std::array<float, 3>& default_mean,
                   const std::array<float, 3>& default_std) {
  mean = default_mean;
  std = default_std;
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

// Ministral 3: [IMG] placeholders (rows separated by [IMG_BREAK], the image
// ended by [IMG_END]) take the image's soft tokens in order; causal.
ImagePrompt pixtral_prompt(const Model& model, ThreadPool& pool, const nlohmann::json& config,
                           const std::vector<int32_t>& ids,
                           const std::vector<std::string>& image_paths) {
  const std::string dir = model.checkpoint.dir();
  const int32_t placeholder = config.value("image_token_index", config.value("image_token_id", 10));
  auto vision = PixtralVision::load(model.checkpoint, config, model.spec.hidden);
  const int64_t D = model.spec.hidden;
  std::array<float, 3> mean, std;
  normalization(dir, mean, std, {0.48145466f, 0.4578275f, 0.40821073f},
                {0.26862954f, 0.26130258f, 0.27577711f});
  ImagePrompt out;
  for (const std::string& path : image_paths) {
    const Image img = read_image(path);
    const Size2 size = pixtral_target_size(img.height, img.width, int(vision->image_size()),
                                           int(vision->patch_multiple()));
    const std::vector<float> pixels =
        normalize_chw(resize_image(img, size.width, size.height, ResizeFilter::Bicubic), mean, std);
    const int64_t T = vision->tokens_for(size.height, size.width),
                  offset = int64_t(out.features.size());
    out.features.resize(out.features.size() + size_t(T * D));
    vision->encode(pool, pixels.data(), size.height, size.width, out.features.data() + offset);
  }
  const int64_t total = int64_t(out.features.size()) / D;
  int64_t slots = 0;
  for (int32_t id : ids) slots += id == placeholder;
  if (slots != total)
    fail("the prompt has %lld image placeholders (id %d) but the %zu images need %lld",
         (long long)slots, placeholder, image_paths.size(), (long long)total);
  out.embeds.assign(ids.size(), nullptr);
  out.key_end.resize(ids.size());
  int64_t next = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    out.key_end[i] = int64_t(i) + 1;
    if (ids[i] == placeholder) out.embeds[i] = out.features.data() + (next++) * D;
  }
  return out;
}

}  // namespace

ImagePrompt build_image_prompt(const Model& model, ThreadPool& pool,
                               const std::vector<int32_t>& ids,
                               const std::vector<std::string>& image_paths) {
  const std::string dir = model.checkpoint.dir();
  nlohmann::json config = read_json(dir + "/config.json");
  const std::string type = config.value("model_type", "");
  if (type == "mistral3") return pixtral_prompt(model, pool, config, ids, image_paths);
  if (type != "gemma3")
    fail(
        "%s: images are supported for Gemma 3 and Mistral 3 checkpoints so far, not model_type "
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
  normalization(dir, mean, std, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f});
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
