#include "server/structured_output.h"

#include <list>
#include <mutex>

#include "server/errors.h"
#include "text/grammar.h"
#include "text/json_schema_grammar.h"

namespace tandem::server {

namespace {

struct Compiled {
  std::shared_ptr<const text::Grammar> grammar;
  std::shared_ptr<const text::TokenVocab> vocab;
  mutable text::MaskCache cache;
};

class GrammarConstraint : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const Compiled> c)
      : c_(std::move(c)), matcher_(c_->grammar) {}

  Allowed allowed() override {
    mask_ = matcher_.mask(c_->vocab->trie, &c_->cache);
    return {&mask_->bits, mask_->can_end, mask_->any_token};
  }

  bool accept(int32_t id) override {
    const text::TokenBytes& t = c_->vocab->tokens;
    if (id < 0 || size_t(id) >= t.bytes.size() || !t.usable[size_t(id)]) return false;
    return matcher_.accept(t.bytes[size_t(id)]);
  }

 private:
  std::shared_ptr<const Compiled> c_;
  text::GrammarMatcher matcher_;
  std::shared_ptr<const text::TokenMask> mask_;
};

class GrammarFactory : public ConstraintFactory {
 public:
  explicit GrammarFactory(std::shared_ptr<const Compiled> c) : c_(std::move(c)) {}
  std::unique_ptr<TokenConstraint> start() const override {
    return std::make_unique<GrammarConstraint>(c_);
  }

 private:
  std::shared_ptr<const Compiled> c_;
};

// The last few compiled formats, most recent first.
constexpr size_t kCompiledCacheSize = 32;
std::mutex cache_mu;
std::list<std::pair<std::string, std::shared_ptr<const Compiled>>> compiled_cache;

}  // namespace

std::shared_ptr<const ConstraintFactory> make_constraint(
    const ResponseFormat& format, const nlohmann::ordered_json& schema,
    std::shared_ptr<const text::TokenVocab> vocab) {
  if (!format.active()) return nullptr;
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(vocab.get())) + "|";
  key += format.type == ResponseFormat::Type::JsonObject
             ? std::string("object")
             : (format.strict ? "strict:" : "schema:") + schema.dump();
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    for (auto it = compiled_cache.begin(); it != compiled_cache.end(); ++it)
      if (it->first == key && it->second->vocab == vocab) {
        compiled_cache.splice(compiled_cache.begin(), compiled_cache, it);
        return std::make_shared<GrammarFactory>(it->second);
      }
  }
  auto c = std::make_shared<Compiled>();
  c->vocab = vocab;
  try {
    c->grammar = std::make_shared<const text::Grammar>(
        format.type == ResponseFormat::Type::JsonObject
            ? text::json_object_grammar()
            : text::compile_json_schema(schema, format.strict));
  } catch (const text::SchemaError& e) {
    const std::string base = "response_format.json_schema.schema";
    throw invalid_value(e.path.empty() ? base : base + "." + e.path,
                        std::string("invalid response_format schema: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    compiled_cache.emplace_front(key, c);
    if (compiled_cache.size() > kCompiledCacheSize) compiled_cache.pop_back();
  }
  return std::make_shared<GrammarFactory>(c);
}

std::shared_ptr<const ConstraintFactory> grammar_constraint(
    std::shared_ptr<const text::Grammar> grammar, std::shared_ptr<const text::TokenVocab> vocab) {
  auto c = std::make_shared<Compiled>();
  c->grammar = std::move(grammar);
  c->vocab = std::move(vocab);
  return std::make_shared<GrammarFactory>(c);
}

}  // namespace tandem::server
