// A multimodal checkpoint's vision side behind one interface, used by
// `tandem logits/run --image` and by the server's vision lane:
//
//   decoded Image --prepare()--> PreparedImage (the family's resize and
//   normalization; cheap, on the caller's thread)
//                 --encode()---> soft tokens [tokens, D_text] (the tower and
//   projector; the expensive part, on the engine thread)
//
// and the prompt layout: which token ids stand for one image once the
// template's image marker is expanded (expansion_ids), which of them take the
// soft tokens (placeholder_id, in order) and whether an image's soft tokens
// attend to each other (bidirectional).
//
// Families: Gemma 3 (SigLIP), Gemma 4 (its own ViT with 2D RoPE and a
// pooler), Mistral 3 (Pixtral); Gemma 3 and Pixtral towers also from a
// llama.cpp mmproj GGUF (--mmproj). Text-only use never constructs a tower,
// so none of its tensors is read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "image/image.h"
#include "model/model.h"
#include "model/vision_ops.h"

namespace tandem {

enum class ImageLayout {
  Gemma3,   // "\n\n" boi, tokens × placeholder, eoi "\n\n" (replaces the boi marker)
  Gemma4,   // boi, tokens × placeholder, eoi (replaces the placeholder marker)
  Pixtral,  // rows of (cols × [IMG] + [IMG_BREAK]), the last break an [IMG_END]
};

// One image after the family's preprocessing, ready for encode().
struct PreparedImage {
  std::vector<float> pixels;  // tower-specific layout (see each tower's header)
  int height = 0;             // pixels after resizing
  int width = 0;
  int64_t rows = 1;  // soft-token grid (Pixtral's [IMG_BREAK] layout); rows·cols = tokens
  int64_t cols = 0;
  int64_t tokens = 0;  // soft tokens this image yields
};

// The token ids of an image's layout, from config.json (family defaults
// where absent). -1: not used by the layout.
struct ImageTokenIds {
  int32_t placeholder = -1;  // takes the soft tokens, in order
  int32_t begin = -1;        // boi (Gemma)
  int32_t end = -1;          // eoi (Gemma) or [IMG_END] (Pixtral)
  int32_t row_break = -1;    // [IMG_BREAK] (Pixtral)
  int32_t marker = -1;       // what the chat template writes for an image
};

class VisionTower {
 public:
  virtual ~VisionTower() = default;

  // The tower of `model`'s checkpoint, per config.json's model_type; or,
  // when model.mmproj is set, the tower of that llama.cpp mmproj file
  // (model/gguf_mmproj.h) with the image token ids of the text model (a
  // GGUF's tokenizer.ggml.tokens, else config.json). Throws Error naming the
  // folder or file (no vision_config, a family without a tower in tandem, a
  // text model of another family than the mmproj's) or the tensor or field
  // at fault.
  static std::unique_ptr<VisionTower> load(const Model& model);
  // Whether config.json describes a vision tower, or an mmproj is given (no
  // tensor is read).
  static bool present(const Model& model);
  // Bytes of the checkpoint's vision tensors (tower and projector), or of
  // the mmproj file: what --text-only leaves unread.
  static size_t checkpoint_bytes(const Model& model);

  // Resizes and normalizes as the family's image processor does. Throws
  // Error for an image the family cannot take (e.g. too thin).
  virtual PreparedImage prepare(const Image& image) const = 0;
  // out: [image.tokens, D_text], unscaled soft tokens (host memory), on the
  // device given to run_on(), else on the CPU over `pool`.
  // Thread-compatible: one encode at a time per tower.
  void encode(ThreadPool& pool, const PreparedImage& image, float* out) const;
  // Runs later encodes on `ops` (a GPU's, backend/cuda/vision_ops.h), which
  // uploads the tower's weights on its first encode; null: the CPU.
  void run_on(std::unique_ptr<VisionOps> ops) { device_ops_ = std::move(ops); }
  // Where encodes run: "cpu" or the device's name.
  const char* device_name() const { return device_ops_ ? device_ops_->name() : "cpu"; }
  // With a device given to run_on(): encodes a mid-gray image once, which
  // uploads the weights now (so the KV cache is sized after them) and shows
  // the tower works there. Throws what encode() throws. On the CPU: nothing.
  void warm_up() const;

  ImageLayout layout() const { return layout_; }
  const ImageTokenIds& ids() const { return ids_; }
  bool bidirectional() const { return bidirectional_; }
  int64_t text_hidden() const { return text_hidden_; }
  // The most soft tokens one image can yield (bounds a bidirectional run).
  int64_t max_tokens_per_image() const { return max_tokens_; }

  // The ids that stand for `image` in the prompt once its marker is expanded.
  std::vector<int32_t> expansion_ids(const PreparedImage& image) const;
  // The same as text, as the family's processor writes it before tokenizing
  // (Gemma 3 adds "\n\n" on both sides); `token_text` spells a token id.
  std::string expansion_text(const PreparedImage& image,
                             const std::function<std::string(int32_t)>& token_text) const;

 protected:
  // The family's encode over `ops`.
  virtual void encode_with(VisionOps& ops, const PreparedImage& image, float* out) const = 0;

  ImageLayout layout_ = ImageLayout::Gemma3;
  ImageTokenIds ids_;
  bool bidirectional_ = false;
  int64_t text_hidden_ = 0;
  int64_t max_tokens_ = 0;

 private:
  std::unique_ptr<VisionOps> device_ops_;
};

// Whether a checkpoint tensor belongs to the vision tower or its projector.
bool is_vision_tensor(const std::string& name);

// Gemma 4's tower, built by model/vision_gemma4.cpp.
std::unique_ptr<VisionTower> load_gemma4_tower(const Model& model, const nlohmann::json& config);

// The soft tokens of a prompt's images placed over its placeholder ids:
// per token, the feature row it takes (or null) and the end of the keys it
// sees (its own position + 1, or the end of its image's run when the tower
// is bidirectional). Throws Error when the placeholder count differs from
// the images' soft tokens.
struct ImagePlacement {
  std::vector<const float*> embeds;  // [n]
  std::vector<int64_t> key_end;      // [n]
  // [begin, end) of each image's run of placeholders (bidirectional towers
  // need a run inside one step).
  std::vector<std::pair<int64_t, int64_t>> runs;
};
ImagePlacement place_images(const VisionTower& tower, const std::vector<int32_t>& ids,
                            const std::vector<int64_t>& tokens_per_image, const float* features);

// The length of a prefill chunk of `n` tokens from position `start` that
// does not cut any of `runs` ([begin, end), sorted): shortened to stop before
// a run it would cut, or — when the chunk starts at or inside that run —
// lengthened to the run's end (a run longer than a step budget still fits
// one step, never split).
int64_t chunk_outside_runs(const std::vector<std::pair<int64_t, int64_t>>& runs, int64_t start,
                           int64_t n);

}  // namespace tandem
