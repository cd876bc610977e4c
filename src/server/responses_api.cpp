#include "server/responses_api.h"

#include "core/clock.h"
#include "server/chat_dialect.h"
#include "server/openai_request.h"
#include "server/server_state.h"

namespace tandem::server {

namespace {

using ojson = nlohmann::ordered_json;
using dialect::at;
using dialect::field;
using dialect::need_string;

// A message item's content parts -> chat content parts.
ojson translate_parts(const ojson& content, const std::string& where, const std::string& role) {
  if (!content.is_array()) throw invalid_type(where, "a string or an array of content parts");
  if (content.empty()) throw invalid_value(where, "'" + where + "' must not be empty");
  ojson parts = ojson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = at(where, i);
    const ojson& part = content[i];
    if (!part.is_object()) throw invalid_type(p, "an object");
    const std::string type = need_string(part, "type", p);
    if (type == "input_text" || type == "output_text" || type == "text") {
      parts.push_back({{"type", "text"}, {"text", need_string(part, "text", p)}});
    } else if (type == "input_image" && role == "user") {
      const ojson* url = field(part, "image_url");
      if (!url) {
        if (field(part, "file_id"))
          throw unsupported(p + ".file_id",
                            "file ids are not supported (this server stores no "
                            "files): send image_url as a data URL");
        throw missing_param(p + ".image_url");
      }
      if (!url->is_string()) throw invalid_type(p + ".image_url", "a string (a URL)");
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", *url}}}});
    } else if (type == "refusal" && role == "assistant") {
      parts.push_back({{"type", "text"}, {"text", need_string(part, "refusal", p)}});
    } else {
      throw unsupported(p + ".type", "content part type '" + type + "' is not supported in " +
                                         role + " messages");
    }
  }
  return parts;
}

std::string joined_text(const ojson& parts) {
  std::string s;
  for (const ojson& p : parts) s += p["text"].get<std::string>();
  return s;
}

void translate_item(const ojson& item, const std::string& where, ojson& messages) {
  if (!item.is_object()) throw invalid_type(where, "an object");
  std::string type = "message";
  if (const ojson* t = field(item, "type")) {
    if (!t->is_string()) throw invalid_type(where + ".type", "a string");
    type = t->get<std::string>();
  }
  if (type == "message") {
    std::string role = need_string(item, "role", where);
    if (role != "user" && role != "assistant" && role != "system" && role != "developer")
      throw invalid_value(where + ".role", "unknown role '" + role +
                                               "' (expected user, assistant, system or developer)");
    const ojson* content = field(item, "content");
    if (!content) throw missing_param(where + ".content");
    if (content->is_string()) {
      messages.push_back({{"role", role}, {"content", *content}});
      return;
    }
    ojson parts = translate_parts(*content, where + ".content", role);
    bool only_text = true;
    for (const ojson& p : parts) only_text = only_text && p["type"] == "text";
    if (role == "assistant" || (only_text && role != "user"))
      messages.push_back({{"role", role}, {"content", joined_text(parts)}});
    else
      messages.push_back({{"role", role}, {"content", std::move(parts)}});
  } else if (type == "function_call") {
    const std::string id = need_string(item, "call_id", where);
    const std::string name = need_string(item, "name", where);
    const std::string args = need_string(item, "arguments", where);
    ojson call = {
        {"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
    // Calls of one turn go into one assistant message (after its text).
    if (!messages.empty() && messages.back()["role"] == "assistant") {
      ojson& last = messages.back();
      if (!last.contains("tool_calls")) last["tool_calls"] = ojson::array();
      last["tool_calls"].push_back(std::move(call));
    } else {
      messages.push_back({{"role", "assistant"},
                          {"content", ""},
                          {"tool_calls", ojson::array({std::move(call)})}});
    }
  } else if (type == "function_call_output") {
    const std::string id = need_string(item, "call_id", where);
    const ojson* out = field(item, "output");
    if (!out) throw missing_param(where + ".output");
    std::string text;
    if (out->is_string())
      text = out->get<std::string>();
    else
      text = joined_text(translate_parts(*out, where + ".output", "tool"));
    messages.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", text}});
  } else if (type == "reasoning") {
    // A previous turn's reasoning: templates drop it from history anyway.
  } else {
    throw unsupported(where + ".type", "input item type '" + type + "' is not supported");
  }
}

ojson translate_tools(const ojson& tools) {
  if (!tools.is_array()) throw invalid_type("tools", "an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = at("tools", i);
    const ojson& t = tools[i];
    if (!t.is_object()) throw invalid_type(p, "an object");
    const std::string type = need_string(t, "type", p);
    if (type != "function")
      throw unsupported(p + ".type", "tool type '" + type + "' is not supported (only 'function')");
    ojson fn = {{"name", need_string(t, "name", p)}};
    if (const ojson* d = field(t, "description")) fn["description"] = *d;
    if (const ojson* params = field(t, "parameters")) fn["parameters"] = *params;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// ---- the response ----

struct Echo {  // request fields the response object repeats
  json instructions, tools, tool_choice, temperature, top_p, max_output_tokens, metadata;
  bool parallel_tool_calls = true;
};

class ResponsesDialect : public ChatDialect {
 public:
  ResponsesDialect(std::string model, Echo echo)
      : id_(random_api_id("resp_")),
        model_(std::move(model)),
        echo_(std::move(echo)),
        created_(unix_seconds()) {}

  std::string id() const override { return id_; }

  json response(const ChatOut& out, const DialectFinish& f) override {
    json output = json::array();
    if (!out.reasoning.empty())
      output.push_back(reasoning_item(random_api_id("rs_"), out.reasoning));
    if (!out.content.empty())
      output.push_back(message_item(random_api_id("msg_"), out.content, "completed"));
    for (const OutputToolCall& c : out.calls)
      output.push_back(call_item(c, c.arguments, "completed"));
    return object(status(f), std::move(output), &f);
  }

  std::string stream_open(int32_t) override {
    const json r = object("in_progress", json::array(), nullptr);
    std::string out = event("response.created", {{"response", r}});
    return out + event("response.in_progress", {{"response", r}});
  }

  std::string stream_delta(const ChatOut& d) override {
    std::string out;
    if (!d.reasoning.empty()) {
      if (kind_ != Kind::Reasoning) {
        out += close_item();
        open(Kind::Reasoning, "rs_");
        out += event("response.output_item.added", {{"output_index", index_},
                                                    {"item",
                                                     {{"type", "reasoning"},
                                                      {"id", item_id_},
                                                      {"summary", json::array()},
                                                      {"content", json::array()}}}});
        out += event("response.content_part.added", part_event(reasoning_part("")));
      }
      text_ += d.reasoning;
      json e = part_ref();
      e["delta"] = d.reasoning;
      out += event("response.reasoning_text.delta", e);
    }
    if (!d.content.empty()) {
      if (kind_ != Kind::Message) {
        out += close_item();
        open(Kind::Message, "msg_");
        json item = message_item(item_id_, "", "in_progress");
        item["content"] = json::array();
        out += event("response.output_item.added", {{"output_index", index_}, {"item", item}});
        out += event("response.content_part.added", part_event(text_part("")));
      }
      text_ += d.content;
      json e = part_ref();
      e["delta"] = d.content;
      e["logprobs"] = json::array();
      out += event("response.output_text.delta", e);
    }
    for (const OutputToolCall& c : d.calls) {
      out += close_item();
      index_ = next_index_++;
      const json item = call_item(c, "", "in_progress");
      const std::string id = item["id"];
      out += event("response.output_item.added", {{"output_index", index_}, {"item", item}});
      out += event("response.function_call_arguments.delta",
                   {{"item_id", id}, {"output_index", index_}, {"delta", c.arguments}});
      out += event("response.function_call_arguments.done",
                   {{"item_id", id}, {"output_index", index_}, {"arguments", c.arguments}});
      json done = item;
      done["arguments"] = c.arguments;
      done["status"] = "completed";
      out += event("response.output_item.done", {{"output_index", index_}, {"item", done}});
      items_.push_back(std::move(done));
    }
    return out;
  }

  std::string stream_close(const DialectFinish& f) override {
    std::string out = close_item();
    if (f.error) {
      json r = object("failed", items_, &f);
      r["error"] = {{"code", f.error->status == 504 ? "timeout" : "server_error"},
                    {"message", f.error->what()}};
      return out + event("response.failed", {{"response", r}});
    }
    const std::string st = status(f);
    return out + event(st == "completed" ? "response.completed" : "response.incomplete",
                       {{"response", object(st, items_, &f)}});
  }

 private:
  enum class Kind { None, Reasoning, Message };

  static std::string status(const DialectFinish& f) {
    if (f.error) return "failed";
    return f.reason == FinishReason::Stop ? "completed" : "incomplete";
  }

  json object(const std::string& st, json output, const DialectFinish* f) const {
    json incomplete = nullptr;
    if (st == "incomplete" && f)
      incomplete = {
          {"reason", f->reason == FinishReason::Length ? "max_output_tokens" : "cancelled"}};
    json usage = nullptr;
    if (f && st != "in_progress")
      usage = {{"input_tokens", f->prompt_tokens},
               {"input_tokens_details", {{"cached_tokens", f->cached_tokens}}},
               {"output_tokens", f->completion_tokens},
               {"output_tokens_details", {{"reasoning_tokens", 0}}},
               {"total_tokens", f->prompt_tokens + f->completion_tokens}};
    return {{"id", id_},
            {"object", "response"},
            {"created_at", created_},
            {"status", st},
            {"error", nullptr},
            {"incomplete_details", incomplete},
            {"instructions", echo_.instructions},
            {"max_output_tokens", echo_.max_output_tokens},
            {"model", model_},
            {"output", std::move(output)},
            {"parallel_tool_calls", echo_.parallel_tool_calls},
            {"previous_response_id", nullptr},
            {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
            {"store", false},
            {"temperature", echo_.temperature},
            {"text", {{"format", {{"type", "text"}}}}},
            {"tool_choice", echo_.tool_choice},
            {"tools", echo_.tools},
            {"top_p", echo_.top_p},
            {"truncation", "disabled"},
            {"usage", usage},
            {"metadata", echo_.metadata}};
  }

  static json text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
  }
  static json reasoning_part(const std::string& text) {
    return {{"type", "reasoning_text"}, {"text", text}};
  }
  static json message_item(const std::string& id, const std::string& text, const char* status) {
    return {{"type", "message"},
            {"id", id},
            {"status", status},
            {"role", "assistant"},
            {"content", json::array({text_part(text)})}};
  }
  static json reasoning_item(const std::string& id, const std::string& text) {
    return {{"type", "reasoning"},
            {"id", id},
            {"summary", json::array()},
            {"content", json::array({reasoning_part(text)})}};
  }
  static json call_item(const OutputToolCall& c, const std::string& args, const char* status) {
    const std::string tail = c.id.rfind("call_", 0) == 0 ? c.id.substr(5) : c.id;
    return {{"type", "function_call"}, {"id", "fc_" + tail}, {"call_id", c.id},
            {"name", c.name},          {"arguments", args},  {"status", status}};
  }

  std::string event(const char* name, json data) {
    json j = {{"type", name}, {"sequence_number", seq_++}};
    for (auto& [k, v] : data.items()) j[k] = v;
    return sse_named_event(name, j);
  }

  void open(Kind k, const char* prefix) {
    kind_ = k;
    index_ = next_index_++;
    item_id_ = random_api_id(prefix);
    text_.clear();
  }
  json part_ref() const {
    return {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}};
  }
  json part_event(json part) const {
    json e = part_ref();
    e["part"] = std::move(part);
    return e;
  }

  std::string close_item() {
    if (kind_ == Kind::None) return "";
    std::string out;
    json item;
    if (kind_ == Kind::Reasoning) {
      json e = part_ref();
      e["text"] = text_;
      out += event("response.reasoning_text.done", e);
      out += event("response.content_part.done", part_event(reasoning_part(text_)));
      item = reasoning_item(item_id_, text_);
    } else {
      json e = part_ref();
      e["text"] = text_;
      e["logprobs"] = json::array();
      out += event("response.output_text.done", e);
      out += event("response.content_part.done", part_event(text_part(text_)));
      item = message_item(item_id_, text_, "completed");
    }
    out += event("response.output_item.done", {{"output_index", index_}, {"item", item}});
    items_.push_back(std::move(item));
    kind_ = Kind::None;
    return out;
  }

  std::string id_, model_;
  Echo echo_;
  int64_t created_;
  int seq_ = 0;
  Kind kind_ = Kind::None;
  int index_ = -1, next_index_ = 0;
  std::string item_id_, text_;
  json items_ = json::array();
};

json plain(const ojson* v, json fallback = nullptr) {
  return v ? json::parse(v->dump()) : fallback;
}

}  // namespace

nlohmann::ordered_json responses_to_chat(const nlohmann::ordered_json& body) {
  if (field(body, "previous_response_id"))
    throw ApiError(400, "unsupported_value", "previous_response_id",
                   "'previous_response_id' is not supported: this server is stateless and stores "
                   "no responses; send the whole conversation in 'input'");
  ojson chat = ojson::object();
  if (const ojson* model = field(body, "model")) chat["model"] = *model;
  ojson messages = ojson::array();
  if (const ojson* ins = field(body, "instructions")) {
    if (!ins->is_string()) throw invalid_type("instructions", "a string");
    messages.push_back({{"role", "system"}, {"content", *ins}});
  }
  const ojson* input = field(body, "input");
  if (!input) throw missing_param("input");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    if (input->empty()) throw invalid_value("input", "'input' must not be empty");
    for (size_t i = 0; i < input->size(); ++i)
      translate_item((*input)[i], at("input", i), messages);
  } else {
    throw invalid_type("input", "a string or an array of input items");
  }
  chat["messages"] = std::move(messages);
  if (const ojson* tools = field(body, "tools"); tools && !(tools->is_array() && tools->empty()))
    chat["tools"] = translate_tools(*tools);
  if (const ojson* choice = field(body, "tool_choice")) {
    if (choice->is_object()) {
      if (need_string(*choice, "type", "tool_choice") != "function")
        throw unsupported("tool_choice.type", "only function tool choices are supported");
      chat["tool_choice"] = {{"type", "function"},
                             {"function", {{"name", need_string(*choice, "name", "tool_choice")}}}};
    } else {
      chat["tool_choice"] = *choice;
    }
  }
  if (const ojson* v = field(body, "max_output_tokens")) chat["max_tokens"] = *v;
  for (const char* name : {"temperature", "top_p", "stream", "parallel_tool_calls"})
    if (const ojson* v = field(body, name)) chat[name] = *v;
  if (const ojson* r = field(body, "reasoning")) {
    if (!r->is_object()) throw invalid_type("reasoning", "an object");
    if (const ojson* effort = field(*r, "effort")) {
      if (!effort->is_string()) throw invalid_type("reasoning.effort", "a string");
      chat["enable_thinking"] = *effort != "none";
    }
  }
  if (const ojson* text = field(body, "text")) {
    if (!text->is_object()) throw invalid_type("text", "an object");
    if (const ojson* format = field(*text, "format")) {
      if (!format->is_object()) throw invalid_type("text.format", "an object");
      const std::string type = need_string(*format, "type", "text.format");
      if (type != "text")
        throw unsupported("text.format.type", "text format '" + type + "' is not supported yet");
    }
  }
  return chat;
}

void handle_responses(ServerState& s, const httplib::Request& req, httplib::Response& res) {
  parse_json_body(req.body);  // UTF-8, JSON, an object: the common 400s
  const ojson body = ojson::parse(req.body);
  const ojson chat = responses_to_chat(body);
  Echo echo;
  echo.instructions = plain(field(body, "instructions"));
  echo.tools = plain(field(body, "tools"), json::array());
  echo.tool_choice = plain(field(body, "tool_choice"), "auto");
  echo.temperature = plain(field(body, "temperature"), 1.0);
  echo.top_p = plain(field(body, "top_p"), 1.0);
  echo.max_output_tokens = plain(field(body, "max_output_tokens"));
  echo.metadata = plain(field(body, "metadata"), json::object());
  if (const ojson* p = field(body, "parallel_tool_calls"); p && p->is_boolean())
    echo.parallel_tool_calls = p->get<bool>();
  handle_chat_dialect(
      s, chat, std::make_shared<ResponsesDialect>(s.options.served_model_name, echo), req, res);
}

}  // namespace tandem::server
