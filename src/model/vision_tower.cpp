#include "model/vision_tower.h"

#include <array>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "image/preprocess.h"
#include "image/resize.h"
#include "model/gguf.h"
#include "model/gguf_mmproj.h"
#include "model/vision_gemma3.h"
#include "model/vision_pixtral.h"

namespace tandem {

namespace {

nlohmann::json read_config(const Model& model) {
  const std::string path = model.checkpoint.dir() + "/config.json";
  std::ifstream f(path);
  if (!f) fail("cannot read %s", path.c_str());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON: %s", path.c_str(), e.what());
  }
}

int32_t config_id(const nlohmann::json& config, std::initializer_list<const char*> keys,
                  int32_t fallback) {
  for (const char* k : keys)
    if (config.contains(k) && config[k].is_number_integer()) return config[k].get<int32_t>();
  return fallback;
}

// The folder's preprocessor_config.json, or an empty object when it has none.
nlohmann::json read_preprocessor(const std::string& dir) {
  const std::string path = dir + "/preprocessor_config.json";
  if (!std::filesystem::exists(path)) return nlohmann::json::object();
  std::ifstream f(path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON: %s", path.c_str(), e.what());
  }
}

// Mean and std of the image processor (preprocessor_config.json's fields),
// the family's defaults where absent.
void normalization(const nlohmann::json& p, std::array<float, 3>& mean, std::array<float, 3>& std) {
  for (int c = 0; c < 3; ++c) {
    if (p.contains("image_mean") && p["image_mean"].is_array())
      mean[c] = p["image_mean"][c].get<float>();
    if (p.contains("image_std") && p["image_std"].is_array())
      std[c] = p["image_std"][c].get<float>();
  }
}

// `ckpt` holds the tower's tensors (the model's checkpoint, or an mmproj's
// translation: kept alive by the tower); `config` is config.json-shaped,
// `preprocessor` preprocessor_config.json-shaped.
class Gemma3Tower : public VisionTower {
 public:
  Gemma3Tower(const Checkpoint& ckpt, const nlohmann::json& config, int64_t text_hidden,
              const nlohmann::json& preprocessor)
      : source_(ckpt), tower_(Gemma3Vision::load(source_, config, text_hidden)) {
    layout_ = ImageLayout::Gemma3;
    ids_.placeholder = config_id(config, {"image_token_index", "image_token_id"}, 262144);
    ids_.begin = config_id(config, {"boi_token_index", "boi_token_id"}, 255999);
    ids_.end = config_id(config, {"eoi_token_index", "eoi_token_id"}, 256000);
    ids_.marker = ids_.begin;
    bidirectional_ = true;
    text_hidden_ = text_hidden;
    max_tokens_ = tower_->tokens_per_image();
    normalization(preprocessor, mean_, std_);
  }

  PreparedImage prepare(const Image& image) const override {
    const Size2 size = gemma3_target_size(int(tower_->image_size()));
    PreparedImage p;
    p.pixels = normalize_chw(resize_image(image, size.width, size.height, ResizeFilter::Bilinear),
                             mean_, std_);
    p.height = size.height;
    p.width = size.width;
    p.cols = p.tokens = tower_->tokens_per_image();
    return p;
  }

  void encode_with(VisionOps& ops, const PreparedImage& image, float* out) const override {
    tower_->encode(ops, image.pixels.data(), out);
  }

 private:
  Checkpoint source_;
  std::unique_ptr<Gemma3Vision> tower_;
  std::array<float, 3> mean_{0.5f, 0.5f, 0.5f}, std_{0.5f, 0.5f, 0.5f};
};

class PixtralTower : public VisionTower {
 public:
  PixtralTower(const Checkpoint& ckpt, const nlohmann::json& config, int64_t text_hidden,
               const nlohmann::json& preprocessor)
      : source_(ckpt), tower_(PixtralVision::load(source_, config, text_hidden)) {
    layout_ = ImageLayout::Pixtral;
    ids_.placeholder = config_id(config, {"image_token_index", "image_token_id"}, 10);
    ids_.row_break = config_id(config, {"image_break_token_id"}, 12);
    ids_.end = config_id(config, {"image_end_token_id"}, 13);
    ids_.marker = ids_.placeholder;
    text_hidden_ = text_hidden;
    const int64_t side = tower_->image_size() / tower_->patch_multiple();
    max_tokens_ = side * side;
    normalization(preprocessor, mean_, std_);
  }

  PreparedImage prepare(const Image& image) const override {
    const Size2 size = pixtral_target_size(image.height, image.width, int(tower_->image_size()),
                                           int(tower_->patch_multiple()));
    PreparedImage p;
    p.pixels = normalize_chw(resize_image(image, size.width, size.height, ResizeFilter::Bicubic),
                             mean_, std_);
    p.height = size.height;
    p.width = size.width;
    p.rows = size.height / tower_->patch_multiple();
    p.cols = size.width / tower_->patch_multiple();
    p.tokens = tower_->tokens_for(size.height, size.width);
    return p;
  }

  void encode_with(VisionOps& ops, const PreparedImage& image, float* out) const override {
    tower_->encode(ops, image.pixels.data(), image.height, image.width, out);
  }

 private:
  Checkpoint source_;
  std::unique_ptr<PixtralVision> tower_;
  std::array<float, 3> mean_{0.48145466f, 0.4578275f, 0.40821073f},
      std_{0.26862954f, 0.26130258f, 0.27577711f};
};

// The id of `token` in a GGUF text model's tokenizer.ggml.tokens, or Error
// naming the file, the token and the mmproj that needs it.
int32_t gguf_token_id(const GgufFile& f, const std::string& token, const std::string& mmproj) {
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (!tokens || !tokens->is_array())
    fail(
        "%s: no tokenizer.ggml.tokens, so the image token \"%s\" that --mmproj %s needs cannot "
        "be found",
        f.path().c_str(), token.c_str(), mmproj.c_str());
  const auto& list = tokens->as_array();
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].is_string() && list[i].as_string() == token) return int32_t(i);
  fail("%s: the tokenizer has no \"%s\" token, which images with --mmproj %s need",
       f.path().c_str(), token.c_str(), mmproj.c_str());
}

// The tower of model.mmproj, its image token ids from the text model: a GGUF
// model's tokenizer.ggml.tokens, or a checkpoint's config.json.
std::unique_ptr<VisionTower> load_mmproj_tower(const Model& model) {
  MmprojTower m = open_mmproj(model.mmproj);
  const bool pixtral = m.projector == "pixtral";
  const std::string& arch = model.spec.arch;
  if (pixtral ? arch != "ministral3" && arch != "llama" : arch != "gemma3_text")
    fail("--mmproj %s: projector type %s needs a %s text model, not %s", m.path.c_str(),
         m.projector.c_str(), pixtral ? "Mistral 3 (ministral3 or llama)" : "Gemma 3",
         arch.c_str());
  if (m.projection_dim != 0 && m.projection_dim != model.spec.hidden)
    fail("--mmproj %s: clip.vision.projection_dim is %lld but the text model's hidden size is %lld",
         m.path.c_str(), (long long)m.projection_dim, (long long)model.spec.hidden);
  nlohmann::json config = m.config;
  // config.json key <- the token's text.
  using Keys = std::vector<std::pair<const char*, const char*>>;
  const Keys tokens = pixtral ? Keys{{"image_token_index", "[IMG]"},
                                     {"image_break_token_id", "[IMG_BREAK]"},
                                     {"image_end_token_id", "[IMG_END]"}}
                              : Keys{{"image_token_index", "<image_soft_token>"},
                                     {"boi_token_index", "<start_of_image>"},
                                     {"eoi_token_index", "<end_of_image>"}};
  if (model.source) {
    const GgufFile& text = *std::static_pointer_cast<const GgufFile>(model.source);
    for (auto [key, token] : tokens) config[key] = gguf_token_id(text, token, m.path);
  } else {
    const nlohmann::json text = read_config(model);
    for (auto [key, token] : tokens)
      if (text.contains(key)) config[key] = text[key];
  }
  // Pixtral's projector norm uses the text model's epsilon, as transformers
  // does (Gemma 3 does not read it).
  config["text_config"]["rms_norm_eps"] = model.spec.norm_eps;
  if (pixtral)
    return std::make_unique<PixtralTower>(m.checkpoint, config, model.spec.hidden, m.preprocessor);
  return std::make_unique<Gemma3Tower>(m.checkpoint, config, model.spec.hidden, m.preprocessor);
}

}  // namespace

bool is_vision_tensor(const std::string& name) {
  for (const char* part : {"vision_tower.", "multi_modal_projector.", "embed_vision.",
                           "vision_model.", "vision_embed"})
    if (name.find(part) != std::string::npos) return true;
  return false;
}

std::unique_ptr<VisionTower> VisionTower::load(const Model& model) {
  if (!model.mmproj.empty()) return load_mmproj_tower(model);
  if (model.source)  // a GGUF model: its tower is a separate mmproj file
    fail(
        "this GGUF model has no vision tower: give its llama.cpp mmproj file with --mmproj FILE "
        "(projector types gemma3, pixtral), or use the safetensors checkpoint for images");
  const nlohmann::json config = read_config(model);
  const std::string type = config.value("model_type", "");
  if (!config.contains("vision_config") || config["vision_config"].is_null())
    fail("%s: config.json has no vision_config, so this model takes no images",
         model.checkpoint.dir().c_str());
  if (type == "gemma3")
    return std::make_unique<Gemma3Tower>(model.checkpoint, config, model.spec.hidden,
                                         read_preprocessor(model.checkpoint.dir()));
  if (type == "mistral3")
    return std::make_unique<PixtralTower>(model.checkpoint, config, model.spec.hidden,
                                          read_preprocessor(model.checkpoint.dir()));
  if (type == "gemma4") return load_gemma4_tower(model, config);
  fail(
      "%s: images are supported for Gemma 3, Gemma 4 and Mistral 3 checkpoints, not model_type "
      "\"%s\"",
      model.checkpoint.dir().c_str(), type.c_str());
}

bool VisionTower::present(const Model& model) {
  if (!model.mmproj.empty()) return true;
  if (model.source) return false;  // GGUF: no config.json; towers are separate mmproj files
  const nlohmann::json config = read_config(model);
  return config.contains("vision_config") && !config["vision_config"].is_null();
}

size_t VisionTower::checkpoint_bytes(const Model& model) {
  if (!model.mmproj.empty()) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(model.mmproj, ec);
    return ec ? 0 : size_t(bytes);
  }
  size_t bytes = 0;
  for (const std::string& name : model.checkpoint.names())
    if (is_vision_tensor(name)) bytes += model.checkpoint.tensor_bytes(name);
  return bytes;
}

void VisionTower::encode(ThreadPool& pool, const PreparedImage& image, float* out) const {
  if (device_ops_) {
    encode_with(*device_ops_, image, out);
    return;
  }
  encode_with(*cpu_vision_ops(pool), image, out);
}

void VisionTower::warm_up() const {
  if (!device_ops_) return;
  Image gray;
  gray.width = gray.height = 256;
  gray.rgb.assign(size_t(3 * 256 * 256), 128);
  const PreparedImage image = prepare(gray);
  std::vector<float> out(size_t(image.tokens * text_hidden_));
  encode_with(*device_ops_, image, out.data());
}

std::vector<int32_t> VisionTower::expansion_ids(const PreparedImage& image) const {
  std::vector<int32_t> ids;
  switch (layout_) {
    case ImageLayout::Gemma3:
    case ImageLayout::Gemma4:
      ids.push_back(ids_.begin);
      ids.insert(ids.end(), size_t(image.tokens), ids_.placeholder);
      ids.push_back(ids_.end);
      break;
    case ImageLayout::Pixtral:
      for (int64_t r = 0; r < image.rows; ++r) {
        ids.insert(ids.end(), size_t(image.cols), ids_.placeholder);
        ids.push_back(r + 1 == image.rows ? ids_.end : ids_.row_break);
      }
      break;
  }
  return ids;
}

std::string VisionTower::expansion_text(
    const PreparedImage& image, const std::function<std::string(int32_t)>& token_text) const {
  std::string text;
  for (int32_t id : expansion_ids(image)) text += token_text(id);
  if (layout_ == ImageLayout::Gemma3) text = "\n\n" + text + "\n\n";
  return text;
}

ImagePlacement place_images(const VisionTower& tower, const std::vector<int32_t>& ids,
                            const std::vector<int64_t>& tokens_per_image, const float* features) {
  const int32_t placeholder = tower.ids().placeholder;
  const int64_t D = tower.text_hidden();
  int64_t total = 0;
  for (int64_t t : tokens_per_image) total += t;
  int64_t slots = 0;
  for (int32_t id : ids) slots += id == placeholder;
  if (slots != total)
    fail("the prompt has %lld image placeholders (id %d) but its %zu images need %lld",
         (long long)slots, placeholder, tokens_per_image.size(), (long long)total);
  ImagePlacement out;
  out.embeds.assign(ids.size(), nullptr);
  out.key_end.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out.key_end[i] = int64_t(i) + 1;
  // Image k owns the next tokens_per_image[k] placeholders; its run spans
  // from its first to its last (Pixtral's breaks fall inside).
  int64_t next = 0;
  size_t i = 0;
  for (int64_t count : tokens_per_image) {
    int64_t first = -1, last = -1;
    for (int64_t taken = 0; taken < count; ++i)
      if (ids[i] == placeholder) {
        if (first < 0) first = int64_t(i);
        last = int64_t(i);
        out.embeds[i] = features + (next++) * D;
        ++taken;
      }
    out.runs.emplace_back(first, last + 1);
    if (tower.bidirectional()) {
      // Gemma 3's runs are contiguous (checked: a hole would be a text token
      // seeing later image tokens).
      if (last - first + 1 != count)
        fail("image %zu: its %lld placeholders are not one contiguous run", out.runs.size(),
             (long long)count);
      for (int64_t j = first; j <= last; ++j) out.key_end[size_t(j)] = last + 1;
    }
  }
  return out;
}

int64_t chunk_outside_runs(const std::vector<std::pair<int64_t, int64_t>>& runs, int64_t start,
                           int64_t n) {
  const int64_t end = start + n;
  for (auto [b, e] : runs)
    if (b < end && end < e) return b > start ? b - start : e - start;
  return n;
}

}  // namespace tandem
