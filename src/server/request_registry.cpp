#include "server/request_registry.h"

namespace tandem::server {

void RequestRegistry::add(const std::string& response_id,
                          const std::shared_ptr<RequestHandle>& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  by_id_.emplace(response_id, handle);
  by_id_.emplace(handle->id(), handle);
}

void RequestRegistry::remove(const std::string& response_id, const std::string& engine_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& key : {response_id, engine_id}) {
    auto [first, last] = by_id_.equal_range(key);
    for (auto it = first; it != last; ++it)
      if (it->second->id() == engine_id) {
        by_id_.erase(it);
        break;
      }
  }
}

std::vector<std::shared_ptr<RequestHandle>> RequestRegistry::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<RequestHandle>> out;
  auto [first, last] = by_id_.equal_range(id);
  for (auto it = first; it != last; ++it) out.push_back(it->second);
  return out;
}

}  // namespace tandem::server
