// Requests in flight, for POST /v1/requests/{id}/cancel.
//
// An entry lives from the engine's accepting a request until its HTTP
// response is complete. Either of its ids finds it: the engine id ("req-7",
// the id /v1/status lists and the X-Request-Id header carries) and the
// response id ("cmpl-…" / "chatcmpl-…"), which a request of `n` choices
// shares among its n engine requests. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace tandem::server {

class RequestRegistry {
 public:
  void add(const std::string& response_id, const std::shared_ptr<RequestHandle>& handle);
  void remove(const std::string& response_id, const std::string& engine_id);
  // The engine requests in flight under this id (none: empty).
  std::vector<std::shared_ptr<RequestHandle>> find(const std::string& id) const;

 private:
  mutable std::mutex mu_;
  std::multimap<std::string, std::shared_ptr<RequestHandle>> by_id_;
};

// Registers on construction, removes on destruction.
class RegistryEntry {
 public:
  RegistryEntry(RequestRegistry& r, std::string response_id, std::shared_ptr<RequestHandle> h)
      : registry_(r), response_id_(std::move(response_id)), engine_id_(h->id()) {
    registry_.add(response_id_, h);
  }
  ~RegistryEntry() { registry_.remove(response_id_, engine_id_); }
  RegistryEntry(const RegistryEntry&) = delete;
  RegistryEntry& operator=(const RegistryEntry&) = delete;

 private:
  RequestRegistry& registry_;
  std::string response_id_, engine_id_;
};

}  // namespace tandem::server
