#include "server/chat_images.h"

#include "core/error.h"
#include "image/image.h"
#include "server/errors.h"

namespace tandem::server {

namespace {

std::string url_of(const nlohmann::json& part) {
  const nlohmann::json& img = part["image_url"];
  return img.is_string() ? img.get<std::string>() : img["url"].get<std::string>();
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

Image read_image(const std::string& url, const std::string& where, const ImageUrlPolicy& policy) {
  try {
    if (starts_with(url, "data:")) return decode_data_url(url);
    if (starts_with(url, "http://") || starts_with(url, "https://")) {
      if (!policy.allow_remote)
        throw ApiError(400, "invalid_value", where,
                       "image URLs are off on this server: send the image inline as a data URL "
                       "(data:image/png;base64,...), or start the server with --allow-image-urls");
      return decode_image(fetch_url(url, policy.limits));
    }
  } catch (const Error& e) {
    throw ApiError(400, "invalid_image", where, std::string("cannot use this image: ") + e.what());
  }
  throw ApiError(400, "invalid_value", where,
                 "an image URL must be a data: URL (data:image/png;base64,...) or an http(s) URL");
}

}  // namespace

ChatImageInputs load_chat_images(const nlohmann::json& messages, const VisionTower& tower,
                                 PromptBuilder& builder, const ImageUrlPolicy& policy) {
  ChatImageInputs out;
  out.text.marker = builder.token_text(tower.ids().marker);
  auto spell = [&](int32_t id) { return builder.token_text(id); };
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& content = messages[i].value("content", nlohmann::json());
    if (!content.is_array()) continue;
    for (size_t j = 0; j < content.size(); ++j) {
      if (content[j].value("type", "") != "image_url") continue;
      const std::string where =
          "messages[" + std::to_string(i) + "].content[" + std::to_string(j) + "].image_url";
      const Image image = read_image(url_of(content[j]), where, policy);
      try {
        out.images.push_back(tower.prepare(image));
      } catch (const Error& e) {
        throw ApiError(400, "invalid_image", where,
                       std::string("cannot use this image: ") + e.what());
      }
      out.text.expansions.push_back(tower.expansion_text(out.images.back(), spell));
    }
  }
  return out;
}

}  // namespace tandem::server
