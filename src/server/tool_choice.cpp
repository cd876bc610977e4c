#include "server/tool_choice.h"

#include <list>
#include <map>
#include <mutex>

#include "server/errors.h"
#include "server/structured_output.h"
#include "text/json_schema_grammar.h"
#include "text/tool_call_grammar.h"

namespace tandem::server {

namespace {

using ojson = nlohmann::ordered_json;

constexpr uint8_t kSentinel = 0xF8;  // 0xF8..0xFF: never a byte of UTF-8 text

// A vocabulary whose marker tokens write sentinel bytes.
struct ToolVocab {
  std::shared_ptr<const text::TokenVocab> base;  // held: its address keys the cache
  std::shared_ptr<const text::TokenVocab> vocab;
  std::map<std::string, std::string> marker_bytes;  // marker -> its bytes in the grammar
};

std::shared_ptr<const ToolVocab> tool_vocab(PromptBuilder& builder,
                                            std::shared_ptr<const text::TokenVocab> base,
                                            const std::vector<std::string>& markers) {
  static std::mutex mu;
  static std::list<std::pair<std::string, std::shared_ptr<const ToolVocab>>> cache;
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(base.get()));
  for (const std::string& m : markers) key += "|" + m;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = cache.begin(); it != cache.end(); ++it)
    if (it->first == key) {
      cache.splice(cache.begin(), cache, it);
      return it->second;
    }
  text::TokenBytes tb = base->tokens;
  for (size_t id = 0; id < tb.bytes.size(); ++id)
    for (char c : tb.bytes[id])
      if (uint8_t(c) >= kSentinel) tb.usable[id] = 0;
  auto out = std::make_shared<ToolVocab>();
  out->base = base;
  uint8_t next = kSentinel;
  for (const std::string& m : markers) {
    const int32_t id = builder.single_token(m);
    if (id < 0 || size_t(id) >= tb.bytes.size() || next == 0) {
      out->marker_bytes[m] = m;
      continue;
    }
    tb.bytes[size_t(id)] = std::string(1, char(next++));
    tb.usable[size_t(id)] = 1;
    out->marker_bytes[m] = tb.bytes[size_t(id)];
  }
  text::TokenTrie trie(tb.bytes, tb.usable);
  out->vocab = std::make_shared<text::TokenVocab>(text::TokenVocab{std::move(tb), std::move(trie)});
  cache.emplace_front(key, out);
  if (cache.size() > 4) cache.pop_back();
  return out;
}

// The reasoning block's closing marker, when the prompt opened one.
std::string closing_marker(text::ReasoningFormat f) {
  const std::vector<std::string> m = text::reasoning_markers(f);
  return m.size() == 2 ? m[1] : "";
}

}  // namespace

bool tool_choice_forced(const OpenAIRequest& r) {
  return (r.tool_choice.mode == ToolChoice::Mode::Required ||
          r.tool_choice.mode == ToolChoice::Mode::Named) &&
         r.tools.is_array() && !r.tools.empty();
}

std::shared_ptr<const ConstraintFactory> tool_choice_constraint(const OpenAIRequest& r,
                                                                const ojson& tools,
                                                                const ChatOutputConfig& output,
                                                                PromptBuilder& builder) {
  const char* what = r.tool_choice.mode == ToolChoice::Mode::Named
                         ? "a named function in 'tool_choice'"
                         : "'tool_choice' \"required\"";
  if (output.tools == text::ToolCallFormat::None)
    throw invalid_value("tool_choice", std::string(what) +
                                           " needs the model's tool-call syntax, and this "
                                           "model's chat template shows none (use \"auto\")");
  if (output.tools == text::ToolCallFormat::Pythonic)
    throw invalid_value("tool_choice", std::string(what) +
                                           " is not supported yet for the pythonic call syntax "
                                           "([f(a=1)]) of this model's template (use \"auto\")");
  std::shared_ptr<const text::TokenVocab> base = builder.token_vocab();
  if (!base) throw invalid_value("tool_choice", std::string(what) + " needs the model's tokenizer");

  text::ToolGrammarSpec spec;
  spec.format = output.tools;
  spec.parallel = r.parallel_tool_calls;
  spec.mistral_args = builder.single_token("[ARGS]") >= 0;
  std::vector<std::string> markers = text::tool_call_markers(output.tools);
  const std::string close = output.starts_in_reasoning ? closing_marker(output.reasoning) : "";
  if (!close.empty()) markers.push_back(close);
  std::shared_ptr<const ToolVocab> tv = tool_vocab(builder, base, markers);
  spec.marker = [tv](std::string_view m) {
    auto it = tv->marker_bytes.find(std::string(m));
    return it != tv->marker_bytes.end() ? it->second : std::string(m);
  };
  if (!close.empty())
    spec.prefix =
        spec.marker(close) + (output.reasoning == text::ReasoningFormat::Think ? "\n\n" : "");
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tools[i]["function"];
    const std::string name = fn.value("name", "");
    if (r.tool_choice.mode == ToolChoice::Mode::Named && name != r.tool_choice.name) continue;
    auto params = fn.find("parameters");
    spec.tools.push_back({name, params != fn.end() ? *params : ojson(), i});
  }

  // Compiled grammars (and their mask caches) are shared by equal requests.
  static std::mutex mu;
  static std::list<std::pair<std::string, std::shared_ptr<const ConstraintFactory>>> cache;
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(tv->vocab.get())) + "|" +
                    text::tool_call_format_name(spec.format) + (spec.parallel ? "|p|" : "|1|") +
                    spec.prefix + "|";
  for (const text::ToolGrammarTool& t : spec.tools) key += t.name + "\x1f" + t.parameters.dump();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = cache.begin(); it != cache.end(); ++it)
      if (it->first == key) {
        cache.splice(cache.begin(), cache, it);
        return it->second;
      }
  }
  std::shared_ptr<const ConstraintFactory> f;
  try {
    f = grammar_constraint(std::make_shared<const text::Grammar>(text::tool_call_grammar(spec)),
                           tv->vocab);
  } catch (const text::SchemaError& e) {
    throw invalid_value(e.path, std::string("cannot enforce ") + what + ": " + e.what());
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace_front(key, f);
  if (cache.size() > 32) cache.pop_back();
  return f;
}

}  // namespace tandem::server
