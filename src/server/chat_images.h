// The vision lane's front half, on the HTTP thread: a chat request's
// image_url parts -> bytes (data: URLs, or http(s) with --allow-image-urls)
// -> decoded images -> the tower's preprocessing -> the text that replaces
// each image marker of the chat template.
//
// Every failure is the request's own 400 naming the part
// (`messages[1].content[0].image_url`): a broken or unsupported image, a URL
// without --allow-image-urls, a fetch that fails or exceeds its limits, an
// image the family cannot take. Nothing here touches the engine.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "image/fetch.h"
#include "model/vision_tower.h"
#include "server/prompt_builder.h"

namespace tandem::server {

struct ImageUrlPolicy {
  bool allow_remote = false;  // http(s) URLs (--allow-image-urls)
  FetchLimits limits;
};

struct ChatImageInputs {
  std::vector<PreparedImage> images;  // in prompt order
  ChatImages text;                    // the marker and each image's expansion
};

// `messages` is already validated (server/openai_request.h).
ChatImageInputs load_chat_images(const nlohmann::json& messages, const VisionTower& tower,
                                 PromptBuilder& builder, const ImageUrlPolicy& policy);

}  // namespace tandem::server
