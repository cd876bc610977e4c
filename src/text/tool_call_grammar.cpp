#include "text/tool_call_grammar.h"

#include "text/json_schema_grammar.h"

namespace tandem::text {

namespace {

using Seq = GrammarBuilder::Seq;

Seq operator+(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The separator between two calls.
std::string separator(const ToolGrammarSpec& spec) {
  switch (spec.format) {
    case ToolCallFormat::Hermes: return "\n";
    case ToolCallFormat::Llama3Json: return "; ";
    case ToolCallFormat::Mistral: return spec.mistral_args ? "" : ", ";
    default: return "";
  }
}

}  // namespace

Grammar tool_call_grammar(const ToolGrammarSpec& spec) {
  GrammarBuilder b;
  SchemaOptions o;
  o.ignore_pattern = true;
  if (spec.format == ToolCallFormat::Gemma4) {
    o.syntax = ValueSyntax::Gemma4;
    o.quote = spec.marker("<|\"|>");
  }
  SchemaRules rules(b, o);
  auto M = [&](std::string_view m) { return b.lit(spec.marker(m)); };
  const int32_t call = b.rule();
  for (const ToolGrammarTool& t : spec.tools) {
    int32_t args;
    try {
      args = t.parameters.is_null() ? rules.any_object() : rules.schema(t.parameters);
    } catch (const SchemaError& e) {
      const std::string base = "tools[" + std::to_string(t.index) + "].function.parameters";
      throw SchemaError(e.path.empty() ? base : base + "." + e.path, e.what());
    }
    const Seq a = {GrammarBuilder::ref(args)};
    const std::string name = nlohmann::json(t.name).dump();
    switch (spec.format) {
      case ToolCallFormat::None:
      case ToolCallFormat::Pythonic: break;  // not supported (server/tool_choice.h refuses it)
      case ToolCallFormat::Hermes:
        b.alt(call, M("<tool_call>") + b.lit("\n{\"name\": " + name + ", \"arguments\": ") + a +
                        b.lit("}\n") + M("</tool_call>"));
        break;
      case ToolCallFormat::Llama3Json:
        b.alt(call, b.lit("{\"name\": " + name + ", \"parameters\": ") + a + b.lit("}"));
        break;
      case ToolCallFormat::Mistral:
        if (spec.mistral_args)
          b.alt(call, M("[TOOL_CALLS]") + b.lit(t.name) + M("[ARGS]") + a);
        else
          b.alt(call, b.lit("{\"name\": " + name + ", \"arguments\": ") + a + b.lit("}"));
        break;
      case ToolCallFormat::Gemma4:
        b.alt(call, M("<|tool_call>") + b.lit("call:" + t.name) + a + M("<tool_call|>"));
        break;
    }
  }
  Seq calls = {GrammarBuilder::ref(call)};
  if (spec.parallel)
    calls.push_back(GrammarBuilder::ref(b.star(b.lit(separator(spec)) + Seq{calls[0]})));
  if (spec.format == ToolCallFormat::Mistral && !spec.mistral_args)
    calls = M("[TOOL_CALLS]") + b.lit("[") + calls + b.lit("]");
  const int32_t root = b.rule();
  b.alt(root, b.lit(spec.prefix) + calls);
  Grammar g = b.build(root);
  check_not_left_recursive(g);
  return g;
}

}  // namespace tandem::text
