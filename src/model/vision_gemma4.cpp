// Gemma 4's vision tower. UNFINISHED: being written; until then a Gemma 4
// checkpoint's images are refused with this message.
#include "core/error.h"
#include "model/vision_tower.h"

namespace tandem {

std::unique_ptr<VisionTower> load_gemma4_tower(const Model& model, const nlohmann::json&) {
  fail("%s: the Gemma 4 vision tower is not implemented yet; text-only requests work",
       model.checkpoint.dir().c_str());
}

}  // namespace tandem
