#include "server/request_registry.h"

namespace tandem::server {

void RequestRegistry::add(const std::string& response_id,
                          const std::shared_ptr<RequestHandle>& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  by_id_[response_id] = handle;
  by_id_[handle->id()] = handle;
}

void RequestRegistry::remove(const std::string& response_id, const std::string& engine_id) {
  std::lock_guard<std::mutex> lock(mu_);
  by_id_.erase(response_id);
  by_id_.erase(engine_id);
}

std::shared_ptr<RequestHandle> RequestRegistry::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

}  // namespace tandem::server
