#include "server/anthropic_api.h"

#include "server/chat_dialect.h"
#include "server/openai_request.h"
#include "server/server_state.h"

namespace tandem::server {

namespace {

using ojson = nlohmann::ordered_json;
using dialect::at;
using dialect::field;
using dialect::need_string;

// A system prompt or tool_result content: a string, or text blocks joined.
std::string text_of(const ojson& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) throw invalid_type(where, "a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = at(where, i);
    if (!v[i].is_object()) throw invalid_type(p, "an object");
    const std::string type = need_string(v[i], "type", p);
    if (type != "text")
      throw unsupported(p + ".type",
                        "block type '" + type + "' is not supported here (use 'text')");
    if (!out.empty()) out += "\n";
    out += need_string(v[i], "text", p);
  }
  return out;
}

// An image block's source -> the URL the chat path reads (a data: URL for
// base64 data, which needs no flag; http(s) URLs need --allow-image-urls).
std::string image_url(const ojson& block, const std::string& where) {
  const ojson* src = field(block, "source");
  if (!src) throw missing_param(where + ".source");
  if (!src->is_object()) throw invalid_type(where + ".source", "an object");
  const std::string type = need_string(*src, "type", where + ".source");
  if (type == "base64")
    return "data:" + need_string(*src, "media_type", where + ".source") + ";base64," +
           need_string(*src, "data", where + ".source");
  if (type == "url") return need_string(*src, "url", where + ".source");
  throw unsupported(where + ".source.type",
                    "image source type '" + type + "' is not supported (use 'base64' or 'url')");
}

// One Messages message -> chat messages (a user turn with tool_result blocks
// becomes one tool message per result, then the rest of the turn).
void translate_message(const ojson& m, const std::string& where, ojson& out) {
  if (!m.is_object()) throw invalid_type(where, "an object");
  const std::string role = need_string(m, "role", where);
  if (role != "user" && role != "assistant")
    throw invalid_value(where + ".role",
                        "unknown role '" + role + "' (expected 'user' or 'assistant')");
  const ojson* content = field(m, "content");
  if (!content) throw missing_param(where + ".content");
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array())
    throw invalid_type(where + ".content", "a string or an array of content blocks");
  ojson parts = ojson::array(), calls = ojson::array();
  std::string text, thinking;
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string p = at(where + ".content", i);
    const ojson& b = (*content)[i];
    if (!b.is_object()) throw invalid_type(p, "an object");
    const std::string type = need_string(b, "type", p);
    if (type == "text") {
      const std::string t = need_string(b, "text", p);
      parts.push_back({{"type", "text"}, {"text", t}});
      text += t;
    } else if (type == "image" && role == "user") {
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", image_url(b, p)}}}});
    } else if (type == "tool_result" && role == "user") {
      const std::string id = need_string(b, "tool_use_id", p);
      std::string result;
      if (const ojson* c = field(b, "content")) result = text_of(*c, p + ".content");
      if (const ojson* e = field(b, "is_error")) {
        if (!e->is_boolean()) throw invalid_type(p + ".is_error", "a boolean");
        if (e->get<bool>()) result = "Error: " + result;
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else if (type == "tool_use" && role == "assistant") {
      const std::string id = need_string(b, "id", p);
      const std::string name = need_string(b, "name", p);
      ojson input = ojson::object();
      if (const ojson* in = field(b, "input")) {
        if (!in->is_object()) throw invalid_type(p + ".input", "an object");
        input = *in;
      }
      calls.push_back({{"id", id},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", input.dump()}}}});
    } else if (type == "thinking" && role == "assistant") {
      if (!thinking.empty()) thinking += "\n";
      thinking += need_string(b, "thinking", p);
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Opaque to this server: dropped.
    } else {
      throw unsupported(p + ".type", "content block type '" + type + "' is not supported in " +
                                         role + " messages");
    }
  }
  if (role == "assistant") {
    ojson msg = {{"role", "assistant"}, {"content", text}};
    if (!thinking.empty()) msg["reasoning_content"] = thinking;
    if (!calls.empty()) msg["tool_calls"] = calls;
    out.push_back(std::move(msg));
  } else if (!parts.empty()) {
    bool only_text = true;
    for (const ojson& part : parts) only_text = only_text && part["type"] == "text";
    if (only_text && parts.size() == 1)
      out.push_back({{"role", "user"}, {"content", parts[0]["text"]}});
    else
      out.push_back({{"role", "user"}, {"content", parts}});
  } else if (content->empty()) {
    throw invalid_value(where + ".content", "'" + where + ".content' must not be empty");
  }
}

ojson translate_tools(const ojson& tools) {
  if (!tools.is_array()) throw invalid_type("tools", "an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = at("tools", i);
    const ojson& t = tools[i];
    if (!t.is_object()) throw invalid_type(p, "an object");
    if (const ojson* type = field(t, "type"); type && *type != "custom")
      throw unsupported(p + ".type",
                        "only custom tools ({name, description, input_schema}) are "
                        "supported, not server tools");
    ojson fn = {{"name", need_string(t, "name", p)}};
    if (const ojson* d = field(t, "description")) {
      if (!d->is_string()) throw invalid_type(p + ".description", "a string");
      fn["description"] = *d;
    }
    const ojson* schema = field(t, "input_schema");
    if (!schema) throw missing_param(p + ".input_schema");
    if (!schema->is_object()) throw invalid_type(p + ".input_schema", "an object (a JSON schema)");
    fn["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

void translate_tool_choice(const ojson& choice, ojson& chat) {
  if (!choice.is_object()) throw invalid_type("tool_choice", "an object");
  const std::string type = need_string(choice, "type", "tool_choice");
  if (type == "auto") {
    chat["tool_choice"] = "auto";
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "none") {
    chat["tool_choice"] = "none";
  } else if (type == "tool") {
    chat["tool_choice"] = {{"type", "function"},
                           {"function", {{"name", need_string(choice, "name", "tool_choice")}}}};
  } else {
    throw invalid_value("tool_choice.type",
                        "'tool_choice.type' must be auto, any, tool or none, "
                        "got '" +
                            type + "'");
  }
  if (const ojson* d = field(choice, "disable_parallel_tool_use")) {
    if (!d->is_boolean()) throw invalid_type("tool_choice.disable_parallel_tool_use", "a boolean");
    if (d->get<bool>()) chat["parallel_tool_calls"] = false;
  }
}

// ---- the response ----

std::string tool_use_id(const std::string& call_id) {
  // "call_" + 24 characters -> "toolu_" + the same 24.
  return "toolu_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}

json input_of(const OutputToolCall& c) {
  json input = json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : json::object();
}

const char* stop_reason(const DialectFinish& f) {
  switch (f.reason) {
    case FinishReason::Length: return "max_tokens";
    case FinishReason::Stop:
      if (f.tool_calls) return "tool_use";
      return f.stop_sequence ? "stop_sequence" : "end_turn";
    default: return "end_turn";  // cancelled
  }
}

json stop_sequence(const DialectFinish& f) {
  return f.stop_sequence && !f.tool_calls ? json(*f.stop_sequence) : json(nullptr);
}

class AnthropicDialect : public ChatDialect {
 public:
  explicit AnthropicDialect(std::string model)
      : id_(random_api_id("msg_")), model_(std::move(model)) {}

  std::string id() const override { return id_; }

  json response(const ChatOut& out, const DialectFinish& f) override {
    json content = json::array();
    if (!out.reasoning.empty())
      content.push_back({{"type", "thinking"}, {"thinking", out.reasoning}, {"signature", ""}});
    if (!out.content.empty()) content.push_back({{"type", "text"}, {"text", out.content}});
    for (const OutputToolCall& c : out.calls)
      content.push_back({{"type", "tool_use"},
                         {"id", tool_use_id(c.id)},
                         {"name", c.name},
                         {"input", input_of(c)}});
    json j = message(std::move(content), stop_reason(f), stop_sequence(f));
    j["usage"] = {{"input_tokens", f.prompt_tokens},
                  {"output_tokens", f.completion_tokens},
                  {"cache_read_input_tokens", f.cached_tokens}};
    return j;
  }

  std::string stream_open(int32_t prompt_tokens) override {
    json m = message(json::array(), nullptr, nullptr);
    m["usage"] = {{"input_tokens", prompt_tokens}, {"output_tokens", 0}};
    return event("message_start", {{"message", std::move(m)}}) + event("ping", json::object());
  }

  std::string stream_delta(const ChatOut& d) override {
    std::string out;
    if (!d.reasoning.empty()) {
      out +=
          open_block(Block::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      out += event(
          "content_block_delta",
          {{"index", index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
    }
    if (!d.content.empty()) {
      out += open_block(Block::Text, {{"type", "text"}, {"text", ""}});
      out += event("content_block_delta",
                   {{"index", index_}, {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
    }
    for (const OutputToolCall& c : d.calls) {
      out += open_block(Block::ToolUse, {{"type", "tool_use"},
                                         {"id", tool_use_id(c.id)},
                                         {"name", c.name},
                                         {"input", json::object()}});
      out +=
          event("content_block_delta",
                {{"index", index_},
                 {"delta", {{"type", "input_json_delta"}, {"partial_json", input_of(c).dump()}}}});
      out += close_block();
    }
    return out;
  }

  std::string stream_close(const DialectFinish& f) override {
    std::string out = close_block();
    if (f.error) return out + event("error", anthropic_error_body(*f.error));
    out += event("message_delta",
                 {{"delta", {{"stop_reason", stop_reason(f)}, {"stop_sequence", stop_sequence(f)}}},
                  {"usage", {{"output_tokens", f.completion_tokens}}}});
    return out + event("message_stop", json::object());
  }

 private:
  enum class Block { None, Thinking, Text, ToolUse };

  json message(json content, json reason, json sequence) const {
    return {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_},
            {"content", std::move(content)},
            {"stop_reason", reason},
            {"stop_sequence", sequence}};
  }

  static std::string event(const char* name, json data) {
    json j = {{"type", name}};
    for (auto& [k, v] : data.items()) j[k] = v;
    return sse_named_event(name, j);
  }

  std::string open_block(Block b, json start) {
    if (block_ == b && b != Block::ToolUse) return "";
    std::string out = close_block();
    index_ = next_index_++;
    block_ = b;
    return out +
           event("content_block_start", {{"index", index_}, {"content_block", std::move(start)}});
  }

  std::string close_block() {
    if (block_ == Block::None) return "";
    block_ = Block::None;
    return event("content_block_stop", {{"index", index_}});
  }

  std::string id_, model_;
  Block block_ = Block::None;
  int index_ = -1, next_index_ = 0;
};

ojson parse_body(const httplib::Request& req) {
  parse_json_body(req.body);  // UTF-8, JSON, an object: the common 400s
  return ojson::parse(req.body);
}

}  // namespace

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
  }
  return status >= 500 ? "api_error" : "invalid_request_error";
}

json anthropic_error_body(const ApiError& e) {
  return {{"type", "error"},
          {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.what()}}}};
}

nlohmann::ordered_json anthropic_to_chat(const nlohmann::ordered_json& body, bool count_only) {
  ojson chat = ojson::object();
  if (const ojson* model = field(body, "model")) chat["model"] = *model;
  if (!count_only) {
    const ojson* max = field(body, "max_tokens");
    if (!max) throw missing_param("max_tokens");
    if (!max->is_number_integer()) throw invalid_type("max_tokens", "an integer");
    chat["max_tokens"] = *max;
  }
  ojson messages = ojson::array();
  if (const ojson* system = field(body, "system")) {
    const std::string text = text_of(*system, "system");
    if (!text.empty()) messages.push_back({{"role", "system"}, {"content", text}});
  }
  const ojson* in = field(body, "messages");
  if (!in) throw missing_param("messages");
  if (!in->is_array()) throw invalid_type("messages", "an array of messages");
  if (in->empty()) throw invalid_value("messages", "'messages' must not be empty");
  for (size_t i = 0; i < in->size(); ++i) translate_message((*in)[i], at("messages", i), messages);
  chat["messages"] = std::move(messages);
  if (const ojson* tools = field(body, "tools")) chat["tools"] = translate_tools(*tools);
  if (const ojson* choice = field(body, "tool_choice")) translate_tool_choice(*choice, chat);
  if (const ojson* stops = field(body, "stop_sequences")) {
    if (!stops->is_array()) throw invalid_type("stop_sequences", "an array of strings");
    for (size_t i = 0; i < stops->size(); ++i)
      if (!(*stops)[i].is_string()) throw invalid_type(at("stop_sequences", i), "a string");
    if (!stops->empty()) chat["stop"] = *stops;
  }
  for (const char* name : {"temperature", "top_p", "top_k", "stream"})
    if (const ojson* v = field(body, name)) chat[name] = *v;
  if (const ojson* thinking = field(body, "thinking")) {
    if (!thinking->is_object()) throw invalid_type("thinking", "an object");
    const std::string type = need_string(*thinking, "type", "thinking");
    if (type != "enabled" && type != "disabled")
      throw invalid_value("thinking.type", "'thinking.type' must be 'enabled' or 'disabled'");
    if (const ojson* b = field(*thinking, "budget_tokens")) {
      if (!b->is_number_integer()) throw invalid_type("thinking.budget_tokens", "an integer");
      if (b->get<int64_t>() < 1 || b->get<int64_t>() > INT32_MAX)
        throw invalid_value("thinking.budget_tokens", "'thinking.budget_tokens' must be >= 1");
      if (type == "enabled") chat["thinking_budget"] = *b;
    }
    chat["enable_thinking"] = type == "enabled";
  }
  if (const ojson* meta = field(body, "metadata"); meta && !meta->is_object())
    throw invalid_type("metadata", "an object");
  return chat;
}

void handle_anthropic_messages(ServerState& s, const httplib::Request& req,
                               httplib::Response& res) {
  const ojson chat = anthropic_to_chat(parse_body(req), /*count_only=*/false);
  handle_chat_dialect(s, chat, std::make_shared<AnthropicDialect>(s.options.served_model_name), req,
                      res);
}

void handle_anthropic_count_tokens(ServerState& s, const httplib::Request& req,
                                   httplib::Response& res) {
  const ojson chat = anthropic_to_chat(parse_body(req), /*count_only=*/true);
  res.status = 200;
  res.set_content(dump_json({{"input_tokens", chat_prompt_tokens(s, chat)}}), "application/json");
}

}  // namespace tandem::server
