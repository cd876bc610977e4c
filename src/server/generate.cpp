// POST /v1/completions and /v1/chat/completions: validate, build the prompt,
// submit to the engine, and answer with one JSON body or a server-sent-event
// stream — watching the client all along, so that no request outlives it.
//
// Outcome -> HTTP (docs/api.md):
//  - admission refused: the engine's status (400 naming the param, 503 with
//    Retry-After);
//  - non-stream: Stop/Length/Cancelled -> 200 with the output; Error -> 500
//    internal_error; Timeout -> 504 timeout (partial output is discarded: a
//    failed request is never presented as a success);
//  - stream: the handler waits for the request's first event before sending
//    headers, so a request that fails before its first token gets a real
//    HTTP status (500/504) too; later failures end the stream with
//    finish_reason "error", `data: {"error": …}` and `data: [DONE]`.
#include <httplib.h>

#include <chrono>
#include <random>
#include <thread>

#include "core/clock.h"
#include "server/chat_dialect.h"
#include "server/chat_images.h"
#include "server/connection_probe.h"
#include "server/openai_response.h"
#include "server/reasoning_budget.h"
#include "server/server_state.h"
#include "server/tool_choice.h"

namespace tandem::server {

namespace {

// How often a waiting handler checks that its client is still there.
constexpr double kPollSeconds = 0.05;
// Events gathered into one socket write when a stream has fallen behind.
constexpr int kMaxEventsPerWrite = 64;
// Status recorded (metrics, log) for a response whose client left: nginx's
// "client closed request". Nobody receives it.
constexpr int kClientGone = 499;

double now_s() {
  return monotonic_seconds();
}

int64_t unix_now() {
  return unix_seconds();
}

std::string random_id(const char* prefix) {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof kAlphabet - 1)];
  return id;
}

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<PreparedImage> images;  // vision lane: in prompt order
};

// What a chat request gives its template, with the client's key order (the
// body parsed again as ordered JSON): the messages, the tools (none with
// tool_choice "none"), and chat_template_kwargs with the thinking switch
// (the request's, else --no-thinking's false, else the template's default).
struct TemplateInputs {
  nlohmann::ordered_json messages, tools, kwargs;
};

TemplateInputs template_inputs(const ServerState& s, const OpenAIRequest& r,
                               const std::string& raw_body) {
  const nlohmann::ordered_json body = nlohmann::ordered_json::parse(raw_body);
  TemplateInputs t;
  t.messages = body.at("messages");
  if (r.tool_choice.mode != ToolChoice::Mode::None && r.tools.is_array() && !r.tools.empty())
    t.tools = body.at("tools");
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && kw->is_object())
    t.kwargs = *kw;
  std::optional<bool> thinking = r.enable_thinking;
  if (!thinking && s.options.no_thinking) thinking = false;
  // Structured output and forced tool calls start with the JSON or the call:
  // a template that can skip the reasoning block (Qwen3) is told to, unless
  // the request says otherwise.
  if (!thinking && (r.response_format.active() || tool_choice_forced(r))) thinking = false;
  if (thinking) t.kwargs["enable_thinking"] = *thinking;
  return t;
}

// The prompt's token ids, from the model's PromptBuilder (server/model_text.h)
// or, without a tokenizer, from a prompt given as ids. A chat request with
// images also gets them decoded and preprocessed here (its own 400s).
Prompt build_prompt(ServerState& s, const OpenAIRequest& r, const Engine& engine,
                    const std::string& raw_body, size_t which = 0) {
  PromptBuilder* builder = s.builder.load();
  if (r.endpoint == Endpoint::Chat) {
    // Chat needs the model folder's tokenizer (cmd_serve passes it when the
    // folder has one).
    if (!builder)
      throw ApiError(400, "no_chat_template", "messages",
                     "this model folder has no tokenizer, so chat is unavailable; use "
                     "/v1/completions with a prompt of token ids");
    const TemplateInputs t = template_inputs(s, r, raw_body);
    if (!r.has_images) return {builder->chat_prompt(t.messages, t.tools, t.kwargs), {}};
    const VisionTower* tower = engine.vision();
    if (!tower)
      throw ApiError(400, "images_unavailable", "messages",
                     "this server does not accept images: " +
                         (s.vision.unavailable.empty() ? std::string("no vision tower is loaded")
                                                       : s.vision.unavailable));
    ImageUrlPolicy policy{s.options.allow_image_urls, s.options.image_url_limits};
    ChatImageInputs in = load_chat_images(r.messages, *tower, *builder, policy);
    Prompt p;
    p.ids = builder->chat_prompt(t.messages, t.tools, t.kwargs, &in.text);
    p.images = std::move(in.images);
    return p;
  }
  const OpenAIRequest::CompletionPrompt& p = r.prompts.at(which);
  if (p.text) {
    if (!builder)
      throw ApiError(400, "no_tokenizer", "prompt",
                     "this model folder has no tokenizer, so 'prompt' must be an array of token "
                     "ids, e.g. [1, 2, 3]");
    return {builder->text_prompt(*p.text), {}};
  }
  return {p.ids, {}};
}

// Every prompt of the request (a completions batch has several), each
// checked against the context (the engine's admission checks come later,
// for all of them before any is submitted).
std::vector<Prompt> build_prompts(ServerState& s, const OpenAIRequest& r, const Engine& engine,
                                  const std::string& raw_body) {
  const size_t count = r.endpoint == Endpoint::Chat ? 1 : r.prompts.size();
  std::vector<Prompt> out;
  for (size_t i = 0; i < count; ++i) {
    out.push_back(build_prompt(s, r, engine, raw_body, i));
    const size_t n = out.back().ids.size();
    if (int64_t(n) >= engine.max_context())
      throw ApiError(400, "context_length_exceeded",
                     r.endpoint == Endpoint::Chat ? "messages"
                     : count > 1                  ? "prompt[" + std::to_string(i) + "]"
                                                  : "prompt",
                     "the prompt is " + std::to_string(n) + " tokens but the context holds " +
                         std::to_string(engine.max_context()) +
                         " (prompt and generated tokens together); shorten the prompt");
  }
  return out;
}

// How the server reads a chat request's output (server/chat_output.h), and
// what the engine must do for it: keep the marker tokens the parsers read,
// and stop where the model's turn ends after its calls.
ChatOutputConfig output_config(const OpenAIRequest& r, PromptBuilder* builder, const Engine& engine,
                               const std::vector<int32_t>& prompt, GenerationParams& params) {
  ChatOutputConfig c;
  // With response_format the output is the constrained JSON, all content.
  if (r.endpoint != Endpoint::Chat || !builder || r.response_format.active()) return c;
  const text::ChatFormat f = builder->chat_format();
  const bool tools =
      r.tool_choice.mode != ToolChoice::Mode::None && r.tools.is_array() && !r.tools.empty();
  c.reasoning = f.reasoning;
  c.tools = tools ? f.tools : text::ToolCallFormat::None;
  c.parallel_tool_calls = r.parallel_tool_calls;
  c.enabled = c.reasoning != text::ReasoningFormat::None || c.tools != text::ToolCallFormat::None;
  if (!c.enabled) return c;
  std::vector<std::string> markers = text::reasoning_markers(c.reasoning);
  for (std::string& m : text::tool_call_markers(c.tools)) markers.push_back(std::move(m));
  params.keep_special = builder->special_ids(markers);
  if (engine.has_streamer())
    for (std::string& stop : text::tool_call_stops(c.tools)) params.stop.push_back(std::move(stop));
  // Does the prompt end inside a reasoning block (a template that opens it)?
  std::string tail;
  for (size_t i = prompt.size() > 8 ? prompt.size() - 8 : 0; i < prompt.size(); ++i)
    tail += builder->token_text(prompt[i]);
  c.starts_in_reasoning = text::prompt_opens_reasoning(c.reasoning, tail);
  return c;
}

// The engine-side constraint of a request's response_format (the schema read
// again from the body, in the client's key order: properties are written in
// that order).
std::shared_ptr<const ConstraintFactory> response_constraint(ServerState& s, const OpenAIRequest& r,
                                                             const std::string& raw_body) {
  PromptBuilder* builder = s.builder.load();
  std::shared_ptr<const text::TokenVocab> vocab = builder ? builder->token_vocab() : nullptr;
  if (!vocab)
    throw ApiError(400, "unsupported_value", "response_format",
                   "response_format needs the model's tokenizer, and this model folder has none");
  nlohmann::ordered_json schema;
  if (r.response_format.type == ResponseFormat::Type::JsonSchema)
    schema = nlohmann::ordered_json::parse(raw_body)["response_format"]["json_schema"]["schema"];
  return make_constraint(r.response_format, schema, vocab);
}

// The engine's refusal as an API error; `prompt_param` names the prompt
// field of this endpoint.
ApiError admission_error(const AdmissionError& e, const std::string& prompt_param) {
  const std::string msg = e.what();
  if (e.status == 503) {
    const char* code = msg.find("shutting down") != std::string::npos ? "shutting_down"
                       : msg.find("stalled") != std::string::npos     ? "engine_unhealthy"
                                                                      : "server_overloaded";
    return ApiError(503, code, "", msg);
  }
  std::string param = e.param;
  if (param == "messages" || param == "prompt") param = prompt_param;
  const char* code =
      msg.find("context") != std::string::npos ? "context_length_exceeded" : "invalid_value";
  return ApiError(e.status, code, param, msg);
}

// A response's usage: each prompt once (n choices share one), the
// completions summed.
struct UsageSum {
  int32_t prompt = 0, completion = 0, cached = 0;
  void add(bool counts_prompt, int32_t prompt_tokens, int32_t completion_tokens,
           int32_t cached_tokens) {
    completion += completion_tokens;
    if (!counts_prompt) return;
    prompt += prompt_tokens;
    cached += cached_tokens;
  }
};

// One accepted request, from submit until its response is complete. For a
// stream it is owned by the content provider, so it lives as long as httplib
// writes the stream.
struct ActiveRequest {
  ServerState& s;
  InFlight in_flight;
  std::shared_ptr<RequestHandle> handle;
  RegistryEntry entry;
  ConnectionProbe probe;
  ResponseContext ctx;
  std::unique_ptr<ChatOutput> output;  // chat output parsing, when ctx.output is enabled
  double start, last_probe, last_token = -1;
  std::optional<GenerationEvent> pending;  // a stream's first event, read before the headers
  bool first_chunk = true;
  size_t text_offset = 0;
  // Another API's wire shape (server/chat_dialect.h), or null for OpenAI's.
  std::shared_ptr<ChatDialect> dialect;
  int32_t prompt_tokens = 0;
  std::vector<std::string> user_stops;  // the request's own stop strings
  std::vector<int32_t> all_ids;         // dialect streams: the ids so far
  bool opened = false;
  bool gone = false;  // next() found the client gone or the server stopping
  // Whether the usage counts this choice's prompt: the first choice of each
  // prompt (the n choices of a prompt share it).
  bool counts_prompt = true;

  ActiveRequest(ServerState& state, std::shared_ptr<RequestHandle> h, ResponseContext c,
                ConnectionProbe p, double t0)
      : s(state),
        in_flight(state),
        handle(h),
        entry(state.registry, c.id, h),
        probe(p),
        ctx(std::move(c)),
        start(t0),
        last_probe(now_s()) {
    if (ctx.output.enabled) output = std::make_unique<ChatOutput>(ctx.output);
  }
  // Whatever path ends the response (an exception included), a request
  // nobody will read is not left running.
  ~ActiveRequest() {
    if (!handle->finished()) handle->cancel();
  }
  ActiveRequest(const ActiveRequest&) = delete;
  ActiveRequest& operator=(const ActiveRequest&) = delete;

  // The next event, waiting in short slices. Cancels the request and returns
  // nullopt when the client has gone or the server is stopping.
  std::optional<GenerationEvent> next(bool block = true) {
    for (;;) {
      std::optional<GenerationEvent> e = handle->next(block ? kPollSeconds : 0.0);
      const double now = now_s();
      // Probe on a clock, not only when idle: a client can leave while
      // tokens flow.
      if (now - last_probe >= kPollSeconds || !e) {
        last_probe = now;
        if (probe.peer_closed() || s.hard_stop.load()) {
          handle->cancel();
          gone = true;
          return std::nullopt;
        }
      }
      if (e) {
        observe(*e, now);
        return e;
      }
      if (!block) return std::nullopt;
    }
  }

  void observe(const GenerationEvent& e, double now) {
    if (!e.ids.empty()) {
      if (last_token < 0) {
        s.metrics.observe_ttft(now - start);
      } else {
        const double per = (now - last_token) / double(e.ids.size());
        for (size_t i = 0; i < e.ids.size(); ++i) s.metrics.observe_inter_token(per);
      }
      last_token = now;
    }
    if (e.finish != FinishReason::None) {
      s.metrics.observe_request(now - start);
      s.metrics.count_finish(finish_reason_name(e.finish));
    }
  }

  // Appends the SSE chunks of one event; true at the end of the stream.
  bool append(const GenerationEvent& e, std::string& out) {
    if (dialect) return append_dialect(e, out);
    if (!append_choice(e, out)) return false;
    UsageSum usage;
    usage.add(true, e.prompt_tokens, e.completion_tokens, e.cached_tokens);
    append_end(ctx, usage, {e}, out);
    return true;
  }

  // Appends one event's chunks of this choice, and its finish chunk at its
  // end; true then.
  bool append_choice(const GenerationEvent& e, std::string& out) {
    const bool end = e.finish != FinishReason::None;
    if (output) {
      ChatOut parsed = output->push(e.text);
      if (end) parsed.append(output->finish());
      if (!e.ids.empty() || !parsed.empty()) {
        out += sse_event(token_chunk_json(ctx, e, first_chunk, text_offset, &parsed));
        first_chunk = false;
      }
    } else if (!e.ids.empty() || !e.text.empty()) {
      out += sse_event(token_chunk_json(ctx, e, first_chunk, text_offset));
      first_chunk = false;
      text_offset += e.text.size();
    }
    if (!end) return false;
    out += sse_event(final_chunk_json(ctx, e.finish, first_chunk, output && output->calls() > 0));
    return true;
  }

  // The end of a stream whose choices ended with `finals`: the usage chunk
  // (if asked for), an error event for each failed choice, [DONE].
  static void append_end(const ResponseContext& ctx, const UsageSum& usage,
                         const std::vector<GenerationEvent>& finals, std::string& out) {
    if (ctx.include_usage)
      out += sse_event(usage_chunk_json(ctx, usage.prompt, usage.completion, usage.cached));
    for (const GenerationEvent& e : finals)
      if (e.finish == FinishReason::Error || e.finish == FinishReason::Timeout)
        out += sse_event(outcome_error(e.finish, e.error).body());
    out += kSseDone;
  }

  // The output parsed (all text is content when the format has no parser).
  ChatOut parse(const GenerationEvent& e) {
    ChatOut parsed;
    if (output) {
      parsed = output->push(e.text);
      if (e.finish != FinishReason::None) parsed.append(output->finish());
    } else {
      parsed.content = e.text;
    }
    return parsed;
  }

  // Which of the request's stop strings ended it: the first one found in the
  // generated tokens' text (the engine stops at the first match).
  std::optional<std::string> matched_stop(const std::vector<int32_t>& ids) const {
    PromptBuilder* builder = s.builder.load();
    if (user_stops.empty() || !builder) return std::nullopt;
    std::string raw;
    for (int32_t id : ids) raw += builder->token_text(id);
    size_t best = std::string::npos;
    std::optional<std::string> which;
    for (const std::string& stop : user_stops)
      if (const size_t at = raw.find(stop); at < best) {
        best = at;
        which = stop;
      }
    return which;
  }

  DialectFinish finish_of(FinishReason reason, const std::string& error, int32_t prompt,
                          int32_t completion, int32_t cached,
                          const std::vector<int32_t>& ids) const {
    DialectFinish f;
    f.reason = reason;
    if (reason == FinishReason::Error || reason == FinishReason::Timeout)
      f.error = outcome_error(reason, error);
    f.prompt_tokens = prompt;
    f.completion_tokens = completion;
    f.cached_tokens = cached;
    f.tool_calls = output && output->calls() > 0;
    if (reason == FinishReason::Stop) f.stop_sequence = matched_stop(ids);
    return f;
  }

  bool append_dialect(const GenerationEvent& e, std::string& out) {
    if (!opened) {
      out += dialect->stream_open(prompt_tokens);
      opened = true;
    }
    all_ids.insert(all_ids.end(), e.ids.begin(), e.ids.end());
    const ChatOut parsed = parse(e);
    if (!parsed.empty()) out += dialect->stream_delta(parsed);
    if (e.finish == FinishReason::None) return false;
    out += dialect->stream_close(finish_of(e.finish, e.error, e.prompt_tokens, e.completion_tokens,
                                           e.cached_tokens, all_ids));
    return true;
  }

  // httplib's chunked content provider: writes what is available (at least
  // one event), returns false to abort the stream.
  bool pump(httplib::DataSink& sink) {
    std::string out;
    bool end = false;
    for (int i = 0; i < kMaxEventsPerWrite && !end; ++i) {
      std::optional<GenerationEvent> e;
      if (pending) {
        e = std::move(pending);
        pending.reset();
      } else {
        e = next(/*block=*/out.empty());
      }
      if (!e) {
        if (out.empty()) return false;  // client gone or server stopping: cancelled
        break;
      }
      end = append(*e, out);
    }
    if (!sink.write(out.data(), out.size())) {
      handle->cancel();
      return false;
    }
    if (end) sink.done();
    return true;
  }
};

// A request's whole output; nullopt when the client has gone.
std::optional<Generation> collect(ActiveRequest& a) {
  Generation g;
  for (;;) {
    std::optional<GenerationEvent> e = a.next();
    if (!e) return std::nullopt;
    g.add(*e);
    if (a.output) {
      g.parsed.append(a.output->push(e->text));
      if (e->finish != FinishReason::None) g.parsed.append(a.output->finish());
    }
    if (e->finish != FinishReason::None) return g;
  }
}

bool failed(FinishReason r) {
  return r == FinishReason::Error || r == FinishReason::Timeout;
}

void answer_whole(ActiveRequest& a, httplib::Response& res) {
  std::optional<Generation> whole = collect(a);
  if (!whole) {
    res.status = kClientGone;
    return;
  }
  const Generation& g = *whole;
  if (failed(g.finish)) throw outcome_error(g.finish, g.error);
  res.status = 200;
  if (a.dialect) {
    ChatOut out = a.output ? g.parsed : ChatOut{{}, g.text, {}};
    const DialectFinish f = a.finish_of(g.finish, g.error, g.prompt_tokens, g.completion_tokens,
                                        g.cached_tokens, g.ids);
    res.set_content(dump_json(a.dialect->response(out, f)), "application/json");
    return;
  }
  res.set_content(dump_json(response_json(a.ctx, g)), "application/json");
}

// Several choices (n > 1, or a batch of prompts): every choice's output,
// or the first failure's error (the other
// choices are cancelled as their ActiveRequests go).
void answer_whole_choices(std::vector<std::shared_ptr<ActiveRequest>>& choices,
                          httplib::Response& res) {
  std::vector<Generation> outs;
  for (auto& a : choices) {
    std::optional<Generation> g = collect(*a);
    if (!g) {
      res.status = kClientGone;
      return;
    }
    if (failed(g->finish)) throw outcome_error(g->finish, g->error);
    outs.push_back(std::move(*g));
  }
  json j = response_json(choices[0]->ctx, outs[0]);
  UsageSum usage;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (i > 0) j["choices"].push_back(response_json(choices[i]->ctx, outs[i])["choices"][0]);
    usage.add(choices[i]->counts_prompt, outs[i].prompt_tokens, outs[i].completion_tokens,
              outs[i].cached_tokens);
  }
  j["usage"] = usage_json(usage.prompt, usage.completion, usage.cached);
  res.status = 200;
  res.set_content(dump_json(j), "application/json");
}

// Several choices: their chunks as they come (each with its index), then one
// usage chunk, the failed choices' errors and [DONE] when all have ended.
struct ChoiceStream {
  std::vector<std::shared_ptr<ActiveRequest>> choices;
  std::vector<bool> done;
  std::vector<GenerationEvent> finals;
  UsageSum usage;

  bool pump(httplib::DataSink& sink) {
    std::string out;
    for (int sweep = 0;; ++sweep) {
      bool got = false;
      for (size_t i = 0; i < choices.size(); ++i) {
        if (done[i]) continue;
        ActiveRequest& a = *choices[i];
        std::optional<GenerationEvent> e;
        if (a.pending) {
          e = std::move(a.pending);
          a.pending.reset();
        } else {
          e = a.next(/*block=*/false);
        }
        if (a.gone) return false;  // the client has gone: every choice is cancelled
        if (!e) continue;
        got = true;
        if (a.append_choice(*e, out)) {
          done[i] = true;
          usage.add(a.counts_prompt, e->prompt_tokens, e->completion_tokens, e->cached_tokens);
          finals.push_back(std::move(*e));
        }
      }
      if (finals.size() == choices.size()) {
        ActiveRequest::append_end(choices[0]->ctx, usage, finals, out);
        if (!sink.write(out.data(), out.size())) return false;
        sink.done();
        return true;
      }
      if (!got && !out.empty()) break;
      if (sweep >= kMaxEventsPerWrite && !out.empty()) break;
      if (!got) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!sink.write(out.data(), out.size())) {
      for (auto& a : choices) a->handle->cancel();
      return false;
    }
    return true;
  }
};

// A stream's first event, read before the headers so that a request failing
// before its first token gets a real status (thrown). False when the client
// has gone (the response's status says so).
bool await_first_event(ActiveRequest& a, httplib::Response& res) {
  std::optional<GenerationEvent> first = a.next();
  if (!first) {
    res.status = kClientGone;
    return false;
  }
  if (failed(first->finish) && first->ids.empty() && first->text.empty())
    throw outcome_error(first->finish, first->error);
  a.pending = std::move(first);
  return true;
}

void start_event_stream(httplib::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies: do not buffer the stream
}

void answer_stream_choices(std::vector<std::shared_ptr<ActiveRequest>> choices,
                           httplib::Response& res) {
  for (auto& a : choices)
    if (!await_first_event(*a, res)) return;
  auto stream = std::make_shared<ChoiceStream>();
  stream->done.assign(choices.size(), false);
  stream->choices = std::move(choices);
  start_event_stream(res);
  res.set_chunked_content_provider(
      "text/event-stream", [stream](size_t, httplib::DataSink& sink) { return stream->pump(sink); },
      [stream](bool success) {
        if (!success)
          for (auto& a : stream->choices) a->handle->cancel();
      });
}

void answer_stream(const std::shared_ptr<ActiveRequest>& a, httplib::Response& res) {
  if (!await_first_event(*a, res)) return;
  start_event_stream(res);
  res.set_chunked_content_provider(
      "text/event-stream", [a](size_t, httplib::DataSink& sink) { return a->pump(sink); },
      [a](bool success) {
        if (!success) a->handle->cancel();
      });
}

}  // namespace

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.retry_after_s() > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s()));
  res.set_content(dump_json(e.body()), "application/json");
}

namespace {

// The model check: a request for another model is answered 404 whatever
// else is wrong with it, as OpenAI does.
void check_model(const ServerState& s, const json& body) {
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw invalid_type("model", "a string");
    if (it->get<std::string>() != s.options.served_model_name)
      throw ApiError(404, "model_not_found", "model",
                     "the model '" + it->get<std::string>() +
                         "' does not exist; this server serves '" + s.options.served_model_name +
                         "'");
  }
}

void run_generation(ServerState& s, Endpoint endpoint, const json& body, const std::string& raw,
                    const httplib::Request& req, httplib::Response& res,
                    std::shared_ptr<ChatDialect> dialect) {
  const double start = now_s();
  check_model(s, body);
  const double max_timeout = s.options.max_request_timeout_s;
  const OpenAIRequest r = endpoint == Endpoint::Chat ? parse_chat_request(body, max_timeout)
                                                     : parse_completion_request(body, max_timeout);

  if (s.draining.load()) throw unavailable("shutting_down", "the server is shutting down");
  Engine* engine = s.engine.load();
  if (!engine) throw unavailable("model_loading", "the model is still loading; retry shortly");

  const std::string prompt_param = endpoint == Endpoint::Chat ? "messages" : "prompt";
  std::vector<Prompt> prompts = build_prompts(s, r, *engine, raw);

  // Bound to the request before submit, so a client that is already gone
  // still gets its request cancelled.
  ConnectionProbe probe(req.remote_addr, req.remote_port, req.local_port);
  GenerationParams params = r.params;
  const ChatOutputConfig output =
      output_config(r, s.builder.load(), *engine, prompts[0].ids, params);
  if (r.response_format.active()) params.constraint = response_constraint(s, r, req.body);
  if (tool_choice_forced(r))
    params.constraint = tool_choice_constraint(r, nlohmann::ordered_json::parse(raw).at("tools"),
                                               output, *s.builder.load());
  else if (r.thinking_budget && !params.constraint && s.builder.load())
    params.constraint = reasoning_budget_constraint(*r.thinking_budget, output, *s.builder.load(),
                                                    engine->spec().vocab);
  const size_t total = prompts.size() * size_t(r.n);
  if (total > size_t(s.options.max_concurrent))
    throw invalid_value(
        prompts.size() > 1 ? "prompt" : "n",
        std::to_string(total) + " choices (" + std::to_string(prompts.size()) +
            " prompts, n=" + std::to_string(r.n) + ") but the server runs at most " +
            std::to_string(s.options.max_concurrent) + " requests at once (--max-concurrent)");
  // One engine sequence a choice: prompt p's choice j is choice p·n + j,
  // sampled with seed + p·n + j.
  std::vector<std::shared_ptr<RequestHandle>> handles;
  std::vector<int32_t> prompt_tokens;
  try {
    // A group is refused before any of it reaches the engine.
    for (const Prompt& prompt : prompts) engine->check(prompt.ids, params, prompt.images);
    for (Prompt& prompt : prompts)
      for (int32_t j = 0; j < r.n; ++j) {
        GenerationParams choice = params;
        choice.sampling.seed += uint64_t(handles.size());
        prompt_tokens.push_back(int32_t(prompt.ids.size()));
        handles.push_back(
            j + 1 == r.n ? engine->submit(std::move(prompt.ids), choice, std::move(prompt.images))
                         : engine->submit(prompt.ids, choice, prompt.images));
      }
  } catch (const AdmissionError& e) {
    for (auto& h : handles) h->cancel();
    throw admission_error(e, prompt_param);
  }
  const std::shared_ptr<RequestHandle>& handle = handles[0];

  ResponseContext ctx;
  ctx.endpoint = endpoint;
  ctx.id = dialect ? dialect->id() : random_id(endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-");
  ctx.created = unix_now();
  ctx.model = s.options.served_model_name;
  ctx.logprobs = r.logprobs;
  ctx.include_usage = r.include_usage;
  ctx.output = output;
  // OpenAI chat streams send a call's arguments as they come; the other
  // APIs' streams send each call whole.
  ctx.output.stream_arguments = r.stream && !dialect;
  if (PromptBuilder* builder = s.builder.load())
    ctx.render = [builder](int32_t id) { return builder->token_text(id); };
  res.set_header("X-Request-Id", handle->id());
  std::vector<std::shared_ptr<ActiveRequest>> choices;
  for (size_t i = 0; i < handles.size(); ++i) {
    ResponseContext c = ctx;
    c.index = int(i);
    auto active = std::make_shared<ActiveRequest>(s, handles[i], std::move(c), probe, start);
    active->dialect = dialect;
    active->prompt_tokens = prompt_tokens[i];
    active->counts_prompt = i % size_t(r.n) == 0;
    active->user_stops = r.params.stop;
    choices.push_back(std::move(active));
  }
  if (choices.size() > 1 && r.stream)
    answer_stream_choices(std::move(choices), res);
  else if (choices.size() > 1)
    answer_whole_choices(choices, res);
  else if (r.stream)
    answer_stream(choices[0], res);
  else
    answer_whole(*choices[0], res);
}

}  // namespace

void handle_generation(ServerState& s, Endpoint endpoint, const httplib::Request& req,
                       httplib::Response& res) {
  run_generation(s, endpoint, parse_json_body(req.body), req.body, req, res, nullptr);
}

void handle_chat_dialect(ServerState& s, const nlohmann::ordered_json& chat_body,
                         std::shared_ptr<ChatDialect> dialect, const httplib::Request& req,
                         httplib::Response& res) {
  const std::string raw = chat_body.dump();
  run_generation(s, Endpoint::Chat, json::parse(raw), raw, req, res, std::move(dialect));
}

int32_t chat_prompt_tokens(ServerState& s, const nlohmann::ordered_json& chat_body) {
  const std::string raw = chat_body.dump();
  const json body = json::parse(raw);
  check_model(s, body);
  const OpenAIRequest r = parse_chat_request(body, s.options.max_request_timeout_s);
  Engine* engine = s.engine.load();
  if (!engine) throw unavailable("model_loading", "the model is still loading; retry shortly");
  return int32_t(build_prompt(s, r, *engine, raw).ids.size());
}

std::string random_api_id(const char* prefix) {
  return random_id(prefix);
}

std::string sse_named_event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + dump_json(data) + "\n\n";
}

}  // namespace tandem::server
