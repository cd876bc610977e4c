#include "server/openai_request.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <random>

namespace tandem::server {

namespace {

constexpr int64_t kMaxTopLogprobs = 20;
constexpr size_t kMaxStops = 4;
constexpr int32_t kCompletionsDefaultMaxTokens = 16;  // as OpenAI's /v1/completions

std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Typed access to one JSON object's fields; absent and null both mean "not
// given". `prefix` is the object's own path, used to name nested params.
class Fields {
 public:
  explicit Fields(const json& obj, std::string prefix = "")
      : obj_(obj), prefix_(std::move(prefix)) {}

  const json* get(const char* name) const {
    auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string path(const char* name) const {
    return prefix_.empty() ? std::string(name) : prefix_ + "." + name;
  }

  std::optional<bool> boolean(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw invalid_type(path(name), "a boolean");
    return v->get<bool>();
  }

  std::optional<std::string> string(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw invalid_type(path(name), "a string");
    return v->get<std::string>();
  }

  // A number in [lo, hi] (or (lo, hi] when `lo_open`).
  std::optional<double> number(const char* name, double lo, double hi, bool lo_open = false) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw invalid_type(path(name), "a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi)
      throw invalid_value(path(name), "'" + path(name) + "' must be in " + (lo_open ? "(" : "[") +
                                          fmt_num(lo) + ", " + fmt_num(hi) + "], got " +
                                          fmt_num(x));
    return x;
  }

  // An integer in [lo, hi]; values beyond int64 saturate (then hit the range).
  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) throw invalid_type(path(name), "an integer");
    int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                    ? INT64_MAX
                    : v->get<int64_t>();
    if (x < lo || x > hi)
      throw invalid_value(path(name), "'" + path(name) + "' must be in [" + std::to_string(lo) +
                                          ", " + std::to_string(hi) + "], got " +
                                          std::to_string(x));
    return x;
  }

 private:
  const json& obj_;
  std::string prefix_;
};

std::string index_path(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

// `logit_bias`: an object from token ids (decimal strings, as OpenAI's
// API takes them) to biases in [-100, 100]. The ids are checked against the
// vocabulary at admission (Engine::submit), where the model is known.
std::vector<std::pair<int32_t, float>> logit_bias(const json& lb) {
  if (!lb.is_object()) throw invalid_type("logit_bias", "an object");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, value] : lb.items()) {
    const std::string where = "logit_bias." + key;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoll(key) > INT32_MAX)
      throw invalid_value(where, "'logit_bias' keys are token ids (\"123\"), got \"" + key + "\"");
    if (!value.is_number()) throw invalid_type(where, "a number");
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0))
      throw invalid_value(where, "a logit bias must be between -100 and 100, got " + value.dump());
    out.emplace_back(int32_t(std::stoll(key)), float(bias));
  }
  return out;
}

// Fields shared by both endpoints.
void parse_common(const json& body, OpenAIRequest& r, double max_timeout_s) {
  Fields f(body);
  r.model = f.string("model");

  SamplingParams& s = r.params.sampling;
  if (auto v = f.number("temperature", 0.0, 2.0)) s.temperature = float(*v);
  if (auto v = f.number("top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = float(*v);
  if (auto v = f.integer("top_k", -1, INT32_MAX)) s.top_k = *v < 0 ? 0 : int32_t(*v);
  if (auto v = f.number("min_p", 0.0, 1.0)) s.min_p = float(*v);
  if (auto v = f.number("repetition_penalty", 0.0, 10.0, /*lo_open=*/true))
    s.repetition_penalty = float(*v);
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*v);
  if (const json* v = f.get("seed")) {
    if (!v->is_number_integer()) throw invalid_type("seed", "an integer");
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
    r.seed_given = true;
  } else {
    // No seed: every request samples differently, as OpenAI's API does.
    static thread_local std::mt19937_64 seeds{std::random_device{}()};
    s.seed = seeds();
  }

  // max_completion_tokens wins over the older max_tokens when both are given.
  std::optional<int64_t> max_tokens = f.integer("max_tokens", 1, INT64_MAX);
  if (auto v = f.integer("max_completion_tokens", 1, INT64_MAX)) max_tokens = v;
  if (max_tokens)
    r.params.max_tokens = int32_t(std::min<int64_t>(*max_tokens, INT32_MAX));
  else
    r.params.max_tokens =
        r.endpoint == Endpoint::Completions ? kCompletionsDefaultMaxTokens : INT32_MAX;

  if (auto n = f.integer("n", INT64_MIN, INT64_MAX)) {
    if (*n < 1 || *n > kMaxChoices)
      throw invalid_value("n", "'n' must be between 1 and " + std::to_string(kMaxChoices) +
                                   ", got " + std::to_string(*n));
    r.n = int32_t(*n);
  }

  if (const json* stop = f.get("stop")) {
    if (stop->is_string()) {
      r.params.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStops)
        throw invalid_value("stop",
                            "'stop' holds at most 4 strings, got " + std::to_string(stop->size()));
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) throw invalid_type(index_path("stop", i), "a string");
        r.params.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      throw invalid_type("stop", "a string or an array of strings");
    }
    for (const std::string& s : r.params.stop)
      if (s.empty()) throw invalid_value("stop", "stop strings must not be empty");
  }

  if (auto v = f.boolean("stream")) r.stream = *v;
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) throw invalid_type("stream_options", "an object");
    if (!r.stream)
      throw invalid_value("stream_options",
                          "'stream_options' is only allowed when 'stream' is true");
    if (auto v = Fields(*so, "stream_options").boolean("include_usage")) r.include_usage = *v;
  }

  if (auto v = f.number("timeout", 0.0, 1e9, /*lo_open=*/true))
    r.params.timeout_s = max_timeout_s > 0 ? std::min(*v, max_timeout_s) : *v;
  if (auto v = f.boolean("ignore_eos")) r.params.ignore_eos = *v;

  if (const json* rf = f.get("response_format")) {
    if (!rf->is_object()) throw invalid_type("response_format", "an object");
    Fields ff(*rf, "response_format");
    auto type = ff.string("type");
    if (!type) throw missing_param("response_format.type");
    ResponseFormat& out = r.response_format;
    if (*type == "text") {
      out.type = ResponseFormat::Type::Text;
    } else if (*type == "json_object") {
      out.type = ResponseFormat::Type::JsonObject;
    } else if (*type == "json_schema") {
      out.type = ResponseFormat::Type::JsonSchema;
      const json* js = ff.get("json_schema");
      if (!js) throw missing_param("response_format.json_schema");
      if (!js->is_object()) throw invalid_type("response_format.json_schema", "an object");
      Fields jf(*js, "response_format.json_schema");
      out.name = jf.string("name").value_or("");
      out.strict = jf.boolean("strict").value_or(false);
      const json* schema = jf.get("schema");
      if (!schema) throw missing_param("response_format.json_schema.schema");
      if (!schema->is_object())
        throw invalid_type("response_format.json_schema.schema", "an object (a JSON schema)");
    } else {
      throw invalid_value("response_format.type",
                          "'response_format.type' must be \"text\", \"json_object\" or "
                          "\"json_schema\", got \"" +
                              *type + "\"");
    }
  }

  if (const json* lb = f.get("logit_bias")) r.params.logit_bias = logit_bias(*lb);
}

// One content part of a chat message.
void validate_part(const json& part, const std::string& where, const std::string& role,
                   bool& has_images) {
  if (!part.is_object()) throw invalid_type(where, "an object");
  Fields f(part, where);
  auto type = f.string("type");
  if (!type) throw missing_param(where + ".type");
  if (*type == "text") {
    if (!f.string("text")) throw missing_param(where + ".text");
  } else if (*type == "image_url") {
    if (role != "user")
      throw invalid_value(where + ".type", "image_url parts are only allowed in user messages");
    const json* img = f.get("image_url");
    if (!img) throw missing_param(where + ".image_url");
    if (img->is_string()) {
      // Some clients send the URL directly; accepted.
    } else if (img->is_object()) {
      if (!Fields(*img, where + ".image_url").string("url"))
        throw missing_param(where + ".image_url.url");
    } else {
      throw invalid_type(where + ".image_url", "an object with a 'url'");
    }
    has_images = true;
  } else if (*type == "input_audio" || *type == "audio_url" || *type == "audio") {
    throw unsupported(where + ".type",
                      "audio input is not supported: tandem takes text and images (send the "
                      "audio's transcript as text)");
  } else if (*type == "refusal" && role == "assistant") {
    if (!f.string("refusal")) throw missing_param(where + ".refusal");
  } else {
    throw unsupported(where + ".type", "content part type '" + *type +
                                           "' is not supported (use 'text' or 'image_url')");
  }
}

void validate_tool_calls(const json& calls, const std::string& where) {
  if (!calls.is_array()) throw invalid_type(where, "an array");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string p = index_path(where, i);
    if (!calls[i].is_object()) throw invalid_type(p, "an object");
    Fields f(calls[i], p);
    if (!f.string("id")) throw missing_param(p + ".id");
    const json* fn = f.get("function");
    if (!fn) throw missing_param(p + ".function");
    if (!fn->is_object()) throw invalid_type(p + ".function", "an object");
    Fields ff(*fn, p + ".function");
    if (!ff.string("name")) throw missing_param(p + ".function.name");
    ff.string("arguments");
  }
}

void validate_messages(const json& messages, bool& has_images) {
  if (!messages.is_array()) throw invalid_type("messages", "an array of messages");
  if (messages.empty()) throw invalid_value("messages", "'messages' must not be empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = index_path("messages", i);
    const json& m = messages[i];
    if (!m.is_object()) throw invalid_type(where, "an object");
    Fields f(m, where);
    auto role = f.string("role");
    if (!role) throw missing_param(where + ".role");
    if (*role != "system" && *role != "developer" && *role != "user" && *role != "assistant" &&
        *role != "tool")
      throw invalid_value(
          where + ".role",
          "unknown role '" + *role + "' (expected system, developer, user, assistant or tool)");
    f.string("name");
    const json* content = f.get("content");
    const bool has_calls = *role == "assistant" && f.get("tool_calls");
    if (has_calls) validate_tool_calls(*f.get("tool_calls"), where + ".tool_calls");
    if (*role == "tool" && !f.string("tool_call_id")) throw missing_param(where + ".tool_call_id");
    if (!content) {
      if (*role == "assistant" && (has_calls || m.contains("content"))) continue;
      throw missing_param(where + ".content");
    }
    if (content->is_string()) continue;
    if (!content->is_array())
      throw invalid_type(where + ".content", "a string or an array of content parts");
    if (content->empty())
      throw invalid_value(where + ".content", "'" + where + ".content' must not be empty");
    for (size_t j = 0; j < content->size(); ++j)
      validate_part((*content)[j], index_path(where + ".content", j), *role, has_images);
  }
}

void validate_tools(const json& tools) {
  if (!tools.is_array()) throw invalid_type("tools", "an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = index_path("tools", i);
    if (!tools[i].is_object()) throw invalid_type(p, "an object");
    Fields f(tools[i], p);
    auto type = f.string("type");
    if (type && *type != "function")
      throw unsupported(p + ".type", "only 'function' tools are supported");
    const json* fn = f.get("function");
    if (!fn) throw missing_param(p + ".function");
    if (!fn->is_object()) throw invalid_type(p + ".function", "an object");
    Fields ff(*fn, p + ".function");
    if (!ff.string("name")) throw missing_param(p + ".function.name");
    ff.string("description");
    if (const json* params = ff.get("parameters"); params && !params->is_object())
      throw invalid_type(p + ".function.parameters", "an object (a JSON schema)");
  }
}

ToolChoice parse_tool_choice(const json& choice, const json& tools) {
  ToolChoice c;
  const bool have_tools = tools.is_array() && !tools.empty();
  if (choice.is_string()) {
    const std::string v = choice.get<std::string>();
    if (v == "auto") return c;
    if (v == "none") {
      c.mode = ToolChoice::Mode::None;
      return c;
    }
    if (v != "required")
      throw invalid_value("tool_choice",
                          "'tool_choice' must be \"none\", \"auto\", \"required\" "
                          "or {\"type\": \"function\", \"function\": {\"name\": "
                          "...}}, got \"" +
                              v + "\"");
    c.mode = ToolChoice::Mode::Required;
  } else if (choice.is_object()) {
    Fields f(choice, "tool_choice");
    if (auto type = f.string("type"); type && *type != "function")
      throw unsupported("tool_choice.type", "only 'function' tool choices are supported");
    const json* fn = f.get("function");
    if (!fn) throw missing_param("tool_choice.function");
    if (!fn->is_object()) throw invalid_type("tool_choice.function", "an object");
    auto name = Fields(*fn, "tool_choice.function").string("name");
    if (!name) throw missing_param("tool_choice.function.name");
    c.mode = ToolChoice::Mode::Named;
    c.name = *name;
    bool known = false;
    if (have_tools)
      for (const json& t : tools) known = known || t["function"].value("name", "") == c.name;
    if (have_tools && !known)
      throw invalid_value("tool_choice.function.name", "'tool_choice' names the function '" +
                                                           c.name + "', which is not in 'tools'");
  } else {
    throw invalid_type("tool_choice", "a string or an object");
  }
  if (!have_tools)
    throw invalid_value("tool_choice",
                        "'tool_choice' \"required\" or a named function needs 'tools'");
  return c;
}

// A token id list; `where` names it in errors.
std::vector<int32_t> token_ids(const json& arr, const std::string& where) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& v = arr[i];
    if (!v.is_number_integer()) throw invalid_type(index_path(where, i), "a token id (integer)");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT32_MAX)
                               : (v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX))
      throw invalid_value(where, "token id " + v.dump() + " at " + index_path(where, i) +
                                     " is outside the vocabulary");
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace

json parse_json_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("surrogate") != std::string::npos)
      throw ApiError(
          400, "invalid_utf8", "",
          "the request body is not valid UTF-8 (near byte " + std::to_string(e.byte) + ")");
    // nlohmann's message after its "[json.exception...] " prefix, without the
    // "last read" echo of the client's bytes.
    std::string detail = what.substr(what.find(']') == std::string::npos ? 0 : what.find(']') + 2);
    if (auto cut = detail.find("; last read"); cut != std::string::npos) detail.resize(cut);
    throw ApiError(400, "invalid_json", "", "the request body is not valid JSON: " + detail);
  }
  if (!j.is_object())
    throw ApiError(400, "invalid_type", "", "the request body must be a JSON object");
  return j;
}

OpenAIRequest parse_completion_request(const json& body, double max_timeout_s) {
  OpenAIRequest r;
  r.endpoint = Endpoint::Completions;
  parse_common(body, r, max_timeout_s);
  Fields f(body);

  const json* prompt = f.get("prompt");
  if (!prompt) throw missing_param("prompt");
  if (prompt->is_string()) {
    r.prompts.push_back({{}, prompt->get<std::string>()});
  } else if (prompt->is_array()) {
    if (prompt->empty()) throw invalid_value("prompt", "'prompt' must not be empty");
    const json& first = (*prompt)[0];
    if (first.is_string() || first.is_array()) {
      // A batch: strings or token id arrays, each answered by n choices.
      if (prompt->size() * size_t(r.n) > size_t(kMaxChoices))
        throw invalid_value("prompt", "a batch of " + std::to_string(prompt->size()) +
                                          " prompts with n=" + std::to_string(r.n) + " is " +
                                          std::to_string(prompt->size() * size_t(r.n)) +
                                          " choices; at most " + std::to_string(kMaxChoices));
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& p = (*prompt)[i];
        const std::string where = index_path("prompt", i);
        if (p.is_string()) {
          r.prompts.push_back({{}, p.get<std::string>()});
        } else if (p.is_array()) {
          if (p.empty()) throw invalid_value(where, "'" + where + "' must not be empty");
          r.prompts.push_back({token_ids(p, where), std::nullopt});
        } else {
          throw invalid_type(where, "a string or an array of token ids");
        }
      }
    } else {
      r.prompts.push_back({token_ids(*prompt, "prompt"), std::nullopt});
    }
  } else {
    throw invalid_type("prompt", "a string or an array of token ids");
  }

  if (auto v = f.integer("logprobs", 0, kMaxTopLogprobs)) {
    r.logprobs = true;
    r.params.top_logprobs = int32_t(*v);
  }
  if (auto echo = f.boolean("echo"); echo && *echo)
    throw unsupported("echo", "'echo' is not supported");
  if (auto v = f.integer("best_of", 1, INT64_MAX); v && *v != 1)
    throw unsupported("best_of", "only best_of=1 is supported");
  if (auto v = f.string("suffix"); v && !v->empty())
    throw unsupported("suffix", "'suffix' is not supported");
  return r;
}

OpenAIRequest parse_chat_request(const json& body, double max_timeout_s) {
  OpenAIRequest r;
  r.endpoint = Endpoint::Chat;
  parse_common(body, r, max_timeout_s);
  Fields f(body);

  const json* messages = f.get("messages");
  if (!messages) throw missing_param("messages");
  validate_messages(*messages, r.has_images);
  r.messages = *messages;

  if (const json* tools = f.get("tools")) {
    validate_tools(*tools);
    r.tools = *tools;
  }
  if (const json* choice = f.get("tool_choice"))
    r.tool_choice = parse_tool_choice(*choice, r.tools);
  if (auto v = f.boolean("parallel_tool_calls")) r.parallel_tool_calls = *v;
  const bool forced_calls = r.tool_choice.mode == ToolChoice::Mode::Required ||
                            r.tool_choice.mode == ToolChoice::Mode::Named;
  if (forced_calls && r.response_format.active())
    throw invalid_value("response_format",
                        "'response_format' cannot be combined with 'tool_choice' \"required\" or "
                        "a named function: the output is then the tool calls");
  r.enable_thinking = f.boolean("enable_thinking");
  if (auto v = f.integer("thinking_budget", 1, INT32_MAX)) r.thinking_budget = int32_t(*v);
  if (const json* kw = f.get("chat_template_kwargs")) {
    if (!kw->is_object()) throw invalid_type("chat_template_kwargs", "an object");
    r.chat_template_kwargs = *kw;
    if (auto it = kw->find("enable_thinking"); it != kw->end() && it->is_boolean())
      r.enable_thinking = it->get<bool>();
  }

  auto logprobs = f.boolean("logprobs");
  auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
  if (top && !(logprobs && *logprobs))
    throw invalid_value("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
  if (logprobs && *logprobs) {
    r.logprobs = true;
    r.params.top_logprobs = int32_t(top.value_or(0));
  }
  return r;
}

}  // namespace tandem::server
