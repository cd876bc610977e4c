// The model catalog: short names (aliases) for Hugging Face repos, with the
// profile tandem needs before it downloads anything.
//
// Contract: Catalog::parse validates the whole document and throws
// tandem::Error naming the source, the alias and the field at fault for an
// unknown key (at any level), a missing required field, a value of the wrong
// type or out of range, or a retired entry whose replacement is not a live
// alias. A parsed Catalog is immutable. Catalog::builtin() is
// catalog/aliases.json as embedded in the binary at build time, or the file
// named by $TANDEM_CATALOG when that is set (for tests and custom catalogs).
//
// Document: {"version": 1, "aliases": {NAME: ENTRY, ...}}. A live ENTRY has
// repo, revision, family, modalities, format, quantization, size_bytes,
// context_length, sampling, reasoning_parser, tool_call_parser (the last two
// a string or null), and optionally gated and description. A retired ENTRY
// has retired (the message) and optionally replacement and any live field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::catalog {

// Recommended sampling; unset fields have no recommendation.
struct Sampling {
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
};

struct Entry {
  std::string name;
  std::string repo;                     // "org/name"
  std::string revision = "main";        // branch, tag or commit
  std::string family;                   // "gemma3", "qwen3", ...
  std::vector<std::string> modalities;  // "text", "vision"
  std::string format;                   // "safetensors" (plain dtypes) or "mlx"
  std::string quantization;             // "bf16", "f16", "f32", "4bit", "8bit"
  uint64_t size_bytes = 0;              // approximate download size
  int64_t context_length = 0;
  Sampling sampling;
  std::string reasoning_parser;  // "" when none
  std::string tool_call_parser;  // "" when none
  bool gated = false;            // needs a license click and HF_TOKEN
  std::string description;
  std::string retired;      // non-empty: the alias is refused with this message
  std::string replacement;  // for a retired alias: the alias to use instead

  bool is_retired() const { return !retired.empty(); }
  bool has_vision() const;
  std::string format_label() const;  // "bf16", "mlx 4bit"
};

class Catalog {
 public:
  // Parses and validates `json_text`; `source` names it in error messages.
  static Catalog parse(const std::string& json_text, const std::string& source);
  // The embedded catalog (or $TANDEM_CATALOG), parsed once per process.
  static const Catalog& builtin();

  const Entry* find(std::string_view name) const;                 // retired entries included
  const std::vector<Entry>& entries() const { return entries_; }  // sorted by name

 private:
  std::vector<Entry> entries_;
};

// Why tandem cannot load this entry's weights, or "" when it can; checked
// before any download (keep it in step with the loader's formats).
std::string unsupported_reason(const Entry& e);

// The entry as JSON (every field; null for unset optional values).
nlohmann::json entry_to_json(const Entry& e);

// Up to `max` names of `candidates` close to `name` (edit distance, prefix
// or substring), closest first.
std::vector<std::string> close_names(std::string_view name,
                                     const std::vector<std::string>& candidates, size_t max = 4);

// True for a valid alias name: [a-z0-9][a-z0-9._-]*, at most 64 characters.
bool valid_alias_name(std::string_view name);

// The built-in catalog text (generated from catalog/aliases.json by CMake).
extern const char kBuiltinCatalogJson[];

}  // namespace tandem::catalog
