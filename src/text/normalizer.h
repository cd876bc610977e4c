// Normalizers of the HF `tokenizers` format ("normalizer" in tokenizer.json):
// text rewrites applied to each stretch of input between added tokens,
// before pre-tokenization. Supported: Sequence, Replace (String or Regex
// pattern), Prepend, NFC, NFD, NFKC, NFKD, Strip. Anything else throws at load
// time, naming the type.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace tandem::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s (valid UTF-8) in place.
  virtual void apply(std::string& s) const = 0;

  // nullptr for a JSON null (no normalizer).
  static std::unique_ptr<Normalizer> from_json(const nlohmann::json& j);
};

// Replaces every occurrence of `from` by `to` in s (no-op when from is empty).
void replace_all(std::string& s, const std::string& from, const std::string& to);

}  // namespace tandem::text
