#include "server/openai_response.h"

namespace tandem::server {

namespace {

const char* object_name(const ResponseContext& ctx, bool chunk) {
  if (ctx.endpoint == Endpoint::Completions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json envelope(const ResponseContext& ctx, bool chunk) {
  json j = {{"id", ctx.id},
            {"object", object_name(ctx, chunk)},
            {"created", ctx.created},
            {"model", ctx.model},
            {"system_fingerprint", kSystemFingerprint}};
  if (chunk && ctx.include_usage) j["usage"] = nullptr;  // as OpenAI: null until the last chunk
  return j;
}

// Logprobs of `n` tokens starting at `ids[0]`, in the endpoint's format.
json logprobs_json(const ResponseContext& ctx, const std::vector<TokenLogprob>& chosen,
                   const std::vector<std::vector<TokenLogprob>>& top, size_t text_offset) {
  if (ctx.endpoint == Endpoint::Chat) {
    json content = json::array();
    for (size_t i = 0; i < chosen.size(); ++i) {
      json alts = json::array();
      if (i < top.size())
        for (const TokenLogprob& t : top[i])
          alts.push_back({{"token", ctx.render(t.id)}, {"logprob", t.logprob}, {"bytes", nullptr}});
      content.push_back({{"token", ctx.render(chosen[i].id)},
                         {"logprob", chosen[i].logprob},
                         {"bytes", nullptr},
                         {"top_logprobs", std::move(alts)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  for (size_t i = 0; i < chosen.size(); ++i) {
    tokens.push_back(ctx.render(chosen[i].id));
    token_logprobs.push_back(chosen[i].logprob);
    json alts = json::object();
    if (i < top.size())
      for (const TokenLogprob& t : top[i]) alts[ctx.render(t.id)] = t.logprob;
    tops.push_back(std::move(alts));
    offsets.push_back(text_offset);  // per-token text is not known yet (no detokenizer)
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// OpenAI tool_calls: in a message [{id, type, function}], in a stream delta
// with each call's index first.
json tool_calls_json(const std::vector<OutputToolCall>& calls, bool delta) {
  json out = json::array();
  for (const OutputToolCall& c : calls) {
    json j = json::object();
    if (delta) j["index"] = c.index;
    if (c.first) {
      j["id"] = c.id;
      j["type"] = "function";
      j["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    } else {
      j["function"] = {{"arguments", c.arguments}};
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

std::string token_id_text(int32_t id) {
  return "token_id:" + std::to_string(id);
}

void Generation::add(const GenerationEvent& e) {
  ids.insert(ids.end(), e.ids.begin(), e.ids.end());
  text += e.text;
  logprobs.insert(logprobs.end(), e.logprobs.begin(), e.logprobs.end());
  top.insert(top.end(), e.top.begin(), e.top.end());
  if (e.finish != FinishReason::None) {
    finish = e.finish;
    error = e.error;
    prompt_tokens = e.prompt_tokens;
    completion_tokens = e.completion_tokens;
    cached_tokens = e.cached_tokens;
  }
}

const char* finish_reason_text(FinishReason r, bool tool_calls) {
  switch (r) {
    case FinishReason::Stop: return tool_calls ? "tool_calls" : "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error:
    case FinishReason::Timeout: return "error";
    case FinishReason::None: break;
  }
  return nullptr;
}

ApiError outcome_error(FinishReason r, const std::string& engine_message) {
  if (r == FinishReason::Timeout)
    return ApiError(504, "timeout", "",
                    (engine_message.empty() ? std::string("the request exceeded its timeout")
                                            : engine_message) +
                        " (raise the request's 'timeout' or the server's --timeout)");
  return internal_error(engine_message.empty() ? "internal error" : engine_message);
}

json usage_json(int32_t prompt_tokens, int32_t completion_tokens, int32_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json response_json(const ResponseContext& ctx, const Generation& g) {
  json choice = {{"index", ctx.index}};
  const bool parsed = ctx.endpoint == Endpoint::Chat && ctx.output.enabled;
  if (parsed) {
    const ChatOut& p = g.parsed;
    json message = {
        {"role", "assistant"},
        {"content", p.content.empty() && !p.calls.empty() ? json(nullptr) : json(p.content)},
        {"refusal", nullptr}};
    if (!p.reasoning.empty()) message["reasoning_content"] = p.reasoning;
    if (!p.calls.empty()) message["tool_calls"] = tool_calls_json(p.calls, false);
    choice["message"] = std::move(message);
  } else if (ctx.endpoint == Endpoint::Chat) {
    choice["message"] = {{"role", "assistant"}, {"content", g.text}, {"refusal", nullptr}};
  } else {
    choice["text"] = g.text;
  }
  choice["logprobs"] = ctx.logprobs ? logprobs_json(ctx, g.logprobs, g.top, 0) : json(nullptr);
  choice["finish_reason"] = finish_reason_text(g.finish, parsed && !g.parsed.calls.empty());
  choice["token_ids"] = g.ids;  // extension (see the header)
  json j = envelope(ctx, false);
  j["choices"] = json::array({std::move(choice)});
  j["usage"] = usage_json(g.prompt_tokens, g.completion_tokens, g.cached_tokens);
  return j;
}

json token_chunk_json(const ResponseContext& ctx, const GenerationEvent& e, bool first,
                      size_t text_offset, const ChatOut* parsed) {
  json choice = {{"index", ctx.index}};
  if (ctx.endpoint == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (parsed) {
      if (!parsed->reasoning.empty()) delta["reasoning_content"] = parsed->reasoning;
      if (!parsed->content.empty() || (parsed->reasoning.empty() && parsed->calls.empty()))
        delta["content"] = parsed->content;
      if (!parsed->calls.empty()) delta["tool_calls"] = tool_calls_json(parsed->calls, true);
    } else {
      delta["content"] = e.text;
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = e.text;
  }
  choice["logprobs"] =
      ctx.logprobs ? logprobs_json(ctx, e.logprobs, e.top, text_offset) : json(nullptr);
  choice["finish_reason"] = nullptr;
  choice["token_ids"] = e.ids;
  json j = envelope(ctx, true);
  j["choices"] = json::array({std::move(choice)});
  return j;
}

json final_chunk_json(const ResponseContext& ctx, FinishReason r, bool first, bool tool_calls) {
  json choice = {{"index", ctx.index}};
  if (ctx.endpoint == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason_text(r, tool_calls);
  choice["token_ids"] = json::array();
  json j = envelope(ctx, true);
  j["choices"] = json::array({std::move(choice)});
  return j;
}

json usage_chunk_json(const ResponseContext& ctx, int32_t prompt_tokens, int32_t completion_tokens,
                      int32_t cached_tokens) {
  json j = envelope(ctx, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

std::string sse_event(const json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

}  // namespace tandem::server
