// response_format (structured outputs): the request's format as a token
// constraint for the engine (engine/constraint.h). json_object: any JSON
// object; json_schema: the schema compiled by text/json_schema_grammar.h.
// Compiled grammars and their mask caches are shared by requests with the
// same schema (a small cache), so a repeated schema starts warm.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/constraint.h"
#include "text/token_bytes.h"

namespace tandem::server {

struct ResponseFormat {
  enum class Type { Text, JsonObject, JsonSchema };
  Type type = Type::Text;
  std::string name;  // json_schema.name
  bool strict = false;
  bool active() const { return type != Type::Text; }
};

// The constraint of a json_object / json_schema format over `vocab`.
// `schema` is json_schema.schema with the client's key order. Throws
// ApiError 400 naming `response_format.json_schema.schema.<path>` for a
// schema that cannot be compiled.
std::shared_ptr<const ConstraintFactory> make_constraint(
    const ResponseFormat& format, const nlohmann::ordered_json& schema,
    std::shared_ptr<const text::TokenVocab> vocab);

// A constraint over a compiled grammar and `vocab` (which must be the one the
// grammar's bytes refer to); its sequences share one mask cache.
std::shared_ptr<const ConstraintFactory> grammar_constraint(
    std::shared_ptr<const text::Grammar> grammar, std::shared_ptr<const text::TokenVocab> vocab);

}  // namespace tandem::server
