// JSON schema -> byte-level grammar (text/grammar.h) for structured outputs.
//
// Supported: type (object, array, string, number, integer, boolean, null,
// and arrays of types), properties, required, additionalProperties (false,
// true or a schema; absent means false: no extra keys are generated), items,
// enum, const, anyOf / oneOf (oneOf's exclusivity is not enforced),
// minItems / maxItems, minLength / maxLength (code points, at most
// kMaxBound), nullable, $ref to "#", "#/$defs/…" and "#/definitions/…"
// (recursion allowed). A pattern other than a trivial ".*" is refused.
// Annotations (title, description, default, examples, $schema, $id,
// $comment, $defs, definitions) are ignored. Any other keyword is refused
// in strict mode and ignored (not enforced) otherwise.
//
// Output form: properties in the order of `properties` (required ones always
// present, optional ones may be skipped), then any additional properties;
// no whitespace except an optional single space after ':' and ','; strings
// are valid UTF-8 with JSON escapes (\u escapes exclude surrogates); enum and
// const values are written in compact JSON; integers have at most 18 digits
// (they fit in int64) and exponents at most 2 (numbers are finite doubles).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "text/grammar.h"

namespace tandem::text {

constexpr int64_t kMaxBound = 4096;  // largest minLength/maxLength/minItems/maxItems bound

// A schema that cannot be compiled. `path` is the offending keyword's path
// from the schema root, dot-separated ("properties.age.minimum"; "" for the
// root itself).
struct SchemaError : std::runtime_error {
  SchemaError(std::string path, const std::string& msg)
      : std::runtime_error(msg), path(std::move(path)) {}
  std::string path;
};

// How values are written. Gemma4: Gemma 4's tool-call argument syntax
// (text/tool_call_parser.h): strings between `quote` bytes, raw (no
// escapes); bare keys where they are plain words (letters, digits, _ - .),
// else quoted; no spaces. Numbers, true/false/null and brackets as JSON.
enum class ValueSyntax { Json, Gemma4 };

struct SchemaOptions {
  bool strict = false;
  bool ignore_pattern = false;  // `pattern` is not enforced instead of refused
  ValueSyntax syntax = ValueSyntax::Json;
  std::string quote;  // Gemma4: the string delimiter's bytes
};

class SchemaCompiler;

// Compiles schemas into rules of a caller's builder; several schemas may
// share one builder (and its common rules). Each schema is its own root for
// $ref.
class SchemaRules {
 public:
  SchemaRules(GrammarBuilder& b, SchemaOptions o);
  ~SchemaRules();
  // The rule of one value valid against `s`. Throws SchemaError.
  int32_t schema(const nlohmann::ordered_json& s);
  int32_t any_object();
  // A value as the syntax writes it.
  std::string render(const nlohmann::ordered_json& v) const;

 private:
  std::unique_ptr<SchemaCompiler> c_;
};

// Throws SchemaError when `g` cannot be run (a $ref cycle writing nothing).
void check_not_left_recursive(const Grammar& g);

// Any JSON object (response_format json_object).
Grammar json_object_grammar();
// Any JSON value.
Grammar json_value_grammar();
// Throws SchemaError.
Grammar compile_json_schema(const nlohmann::ordered_json& schema, bool strict);

}  // namespace tandem::text
