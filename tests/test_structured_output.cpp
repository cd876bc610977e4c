// Structured outputs: the JSON-schema grammar compiler, the byte-level
// matcher and its token masks, constrained decoding in the engine with a
// random-weight model (every output parses and validates), and
// response_format over HTTP on the text and vision lanes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/engine.h"
#include "model/model.h"
#include "server/model_text.h"
#include "server/structured_output.h"
#include "test_server_util.h"
#include "test_util.h"
#include "text/grammar.h"
#include "text/json_schema_grammar.h"
#include "text/token_bytes.h"

using namespace tandem;
using ojson = nlohmann::ordered_json;
using nlohmann::json;

namespace {

std::shared_ptr<const text::Grammar> schema_grammar(const std::string& schema,
                                                    bool strict = false) {
  return std::make_shared<const text::Grammar>(
      text::compile_json_schema(ojson::parse(schema), strict));
}

bool matches(const std::shared_ptr<const text::Grammar>& g, const std::string& s) {
  text::GrammarMatcher m(g);
  return m.accept(s) && m.accepting();
}

bool prefix_ok(const std::shared_ptr<const text::Grammar>& g, const std::string& s) {
  text::GrammarMatcher m(g);
  return m.accept(s);
}

// The path of the SchemaError a schema raises ("<none>" if it compiles).
std::string error_path(const std::string& schema, bool strict) {
  try {
    text::compile_json_schema(ojson::parse(schema), strict);
  } catch (const text::SchemaError& e) {
    return e.path;
  }
  return "<none>";
}

// ---- an independent validator for the supported subset ----

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool validate(const ojson& v, const ojson& s, const ojson& root, std::string& why);

const ojson& resolve(const std::string& ref, const ojson& root) {
  if (ref == "#") return root;
  for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
    const std::string p = prefix;
    if (ref.rfind(p, 0) == 0) return root[p.substr(2, p.size() - 3)][ref.substr(p.size())];
  }
  throw std::runtime_error("bad ref " + ref);
}

bool validate_type(const ojson& v, const std::string& t, const ojson& s, const ojson& root,
                   std::string& why) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "integer") return v.is_number_integer();
  if (t == "number") return v.is_number();
  if (t == "string") {
    if (!v.is_string()) return false;
    const size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>())
      return why = "minLength", false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>())
      return why = "maxLength", false;
    return true;
  }
  if (t == "array") {
    if (!v.is_array()) return false;
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>())
      return why = "minItems", false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>())
      return why = "maxItems", false;
    if (s.contains("items"))
      for (const ojson& x : v)
        if (!validate(x, s["items"], root, why)) return false;
    return true;
  }
  if (t == "object") {
    if (!v.is_object()) return false;
    const ojson props = s.value("properties", ojson::object());
    for (const ojson& r : s.value("required", ojson::array()))
      if (!v.contains(r.get<std::string>())) return why = "required " + r.dump(), false;
    // Keys in the order of `properties`, extras after.
    size_t last = 0;
    for (auto it = v.begin(); it != v.end(); ++it) {
      size_t idx = 0;
      bool listed = false;
      for (auto p = props.begin(); p != props.end(); ++p, ++idx)
        if (p.key() == it.key()) {
          listed = true;
          break;
        }
      if (listed) {
        if (idx < last) return why = "property order", false;
        last = idx;
        if (!validate(it.value(), props[it.key()], root, why)) return false;
      } else {
        last = props.size();
        const ojson ap = s.value("additionalProperties", ojson(false));
        if (ap.is_boolean() && !ap.get<bool>()) return why = "extra key " + it.key(), false;
        if (ap.is_object() && !validate(it.value(), ap, root, why)) return false;
      }
    }
    return true;
  }
  return false;
}

bool validate(const ojson& v, const ojson& s, const ojson& root, std::string& why) {
  if (s.contains("$ref")) return validate(v, resolve(s["$ref"], root), root, why);
  if (s.value("nullable", false) && v.is_null()) return true;
  if (s.contains("const")) return v == s["const"] || (why = "const", false);
  if (s.contains("enum")) {
    for (const ojson& e : s["enum"])
      if (v == e) return true;
    return why = "enum", false;
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k)) {
      for (const ojson& sub : s[k])
        if (validate(v, sub, root, why)) return true;
      return why = k, false;
    }
  std::vector<std::string> types;
  if (s.contains("type")) {
    if (s["type"].is_string())
      types.push_back(s["type"]);
    else
      for (const ojson& t : s["type"]) types.push_back(t);
  } else if (s.contains("properties") || s.contains("required") ||
             s.contains("additionalProperties")) {
    types.push_back("object");
  } else if (s.contains("items")) {
    types.push_back("array");
  } else {
    return true;
  }
  for (const std::string& t : types)
    if (validate_type(v, t, s, root, why)) return true;
  if (why.empty()) why = "type";
  return false;
}

const std::vector<std::string>& test_schemas() {
  static const std::vector<std::string> s = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false})",
      R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]}},"required":["color"]})",
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"nothing":{"type":"null"}},"required":["ok","nothing"]})",
      R"({"type":"number"})",
      R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":4})",
      R"({"type":"array","items":{"type":"string","maxLength":5},"maxItems":3})",
      R"({"properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":4},"c":{"type":"boolean"}},"required":["b"]})",
      R"({"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer"},"tags":{"type":"array","items":{"enum":["x","y"]},"maxItems":3}},"required":["id","tags"]}},"required":["user"]})",
      R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":3}]})",
      R"({"type":["string","null"],"maxLength":4})",
      R"({"type":"integer","nullable":true})",
      R"({"type":"object","properties":{"kind":{"const":"point"},"x":{"type":"number"},"y":{"type":"number"}},"required":["kind","x","y"]})",
      R"({"$defs":{"pt":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"]}},"type":"object","properties":{"a":{"$ref":"#/$defs/pt"},"b":{"$ref":"#/$defs/pt"}},"required":["a","b"]})",
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},"$ref":"#/$defs/node"})",
      R"({"definitions":{"s":{"type":"string","minLength":1,"maxLength":3}},"type":"array","items":{"$ref":"#/definitions/s"},"minItems":2,"maxItems":2})",
      R"({"type":"string","minLength":3,"maxLength":6})",
      R"({"type":"object","additionalProperties":false,"properties":{"id":{"type":"string","maxLength":2},"n":{"type":"integer","nullable":true}},"required":["id"]})",
      R"({"oneOf":[{"type":"object","properties":{"t":{"const":"a"},"n":{"type":"integer"}},"required":["t","n"]},{"type":"object","properties":{"t":{"const":"b"},"s":{"type":"boolean"}},"required":["t","s"]}]})",
      R"({"enum":[1,2.5,"three",null,true,{"k":[1]}]})",
      R"({"type":"array","items":{"type":"array","items":{"type":"integer"},"maxItems":3},"maxItems":3})",
      R"({"type":"object","properties":{}})",
      R"({"type":"boolean"})",
      R"({"type":"object","properties":{"ключ":{"enum":["é","日本"]},"n":{"type":["integer","boolean"]}},"required":["ключ","n"]})",
      R"({"title":"t","description":"d","type":"object","properties":{"q":{"type":"string","maxLength":3,"description":"x"}},"required":["q"],"additionalProperties":false})",
  };
  return s;
}

}  // namespace

// ---- grammar ----

TEST(JsonSchemaGrammar, AcceptsAndRejects) {
  auto g = schema_grammar(test_schemas()[0]);
  EXPECT_TRUE(matches(g, R"({"name":"bob","age":42})"));
  EXPECT_TRUE(matches(g, R"({"name": "bob", "age": -7})"));
  EXPECT_FALSE(matches(g, R"({"age":42,"name":"bob"})"));       // order of `properties`
  EXPECT_FALSE(matches(g, R"({"name":"bob"})"));                // required
  EXPECT_FALSE(matches(g, R"({"name":"bobbobbob","age":1})"));  // maxLength 8
  EXPECT_FALSE(matches(g, R"({"name":"bob","age":1.5})"));
  EXPECT_FALSE(matches(g, R"({"name":"bob","age":01})"));
  EXPECT_FALSE(matches(g, R"({"name":"bob","age":1,"x":1})"));  // additionalProperties
  EXPECT_FALSE(matches(g, R"( {"name":"bob","age":1})"));
  EXPECT_TRUE(prefix_ok(g, R"({"name":"b)"));
  EXPECT_FALSE(prefix_ok(g, R"({"nam ")"));

  auto opt = schema_grammar(test_schemas()[6]);
  for (const char* ok : {R"({"b":""})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})",
                         R"({"a":1,"b":"abcd","c":false})"})
    EXPECT_TRUE(matches(opt, ok)) << ok;
  for (const char* bad : {R"({})", R"({"a":1})", R"({"b":"x",})", R"({,"b":"x"})"})
    EXPECT_FALSE(matches(opt, bad)) << bad;

  auto num = schema_grammar(R"({"type":"number"})");
  for (const char* ok : {"0", "-0", "1.5", "12e3", "1E-2", "-3.25e+10"})
    EXPECT_TRUE(matches(num, ok)) << ok;
  for (const char* bad : {"01", ".5", "1.", "1e", "+1", "--1", "NaN"})
    EXPECT_FALSE(matches(num, bad)) << bad;

  auto str = schema_grammar(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(matches(str, "\"ab\""));
  EXPECT_TRUE(matches(str, "\"日本語\""));  // code points, not bytes
  EXPECT_TRUE(matches(str, R"("\n\u00e9")"));
  EXPECT_FALSE(matches(str, "\"a\""));
  EXPECT_FALSE(matches(str, "\"abcd\""));
  EXPECT_FALSE(matches(str, R"("\ud800x")"));       // lone surrogate escape
  EXPECT_FALSE(matches(str, "\"a\xff\""));          // invalid UTF-8
  EXPECT_FALSE(matches(str, "\"a\xed\xa0\x80\""));  // encoded surrogate
  EXPECT_FALSE(matches(str, "\"a\nb\""));           // raw control character

  auto arr = schema_grammar(test_schemas()[4]);
  EXPECT_TRUE(matches(arr, "[1]"));
  EXPECT_TRUE(matches(arr, "[1, 2,3,4]"));
  EXPECT_FALSE(matches(arr, "[]"));
  EXPECT_FALSE(matches(arr, "[1,2,3,4,5]"));

  auto rec = schema_grammar(test_schemas()[13]);
  EXPECT_TRUE(matches(rec, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(matches(rec, R"({"v":1,"kids":[{"v":2},{"v":3},{"v":4}]})"));

  auto en = schema_grammar(test_schemas()[18]);
  for (const char* ok : {"1", "2.5", "\"three\"", "null", "true", R"({"k":[1]})"})
    EXPECT_TRUE(matches(en, ok)) << ok;
  EXPECT_FALSE(matches(en, "2"));

  auto nul = schema_grammar(R"({"type":["string","null"]})");
  EXPECT_TRUE(matches(nul, "null"));
  EXPECT_TRUE(matches(nul, "\"x\""));
  EXPECT_FALSE(matches(nul, "1"));

  // Additional properties (keys are free strings, so not in the random-model
  // set, where they need not end).
  auto extra = schema_grammar(
      R"({"type":"object","additionalProperties":{"type":"integer"},"properties":{"id":{"type":"string"}},"required":["id"]})");
  EXPECT_TRUE(matches(extra, R"({"id":"ab","x":1, "y":2})"));
  EXPECT_TRUE(matches(extra, R"({"id":"ab"})"));
  EXPECT_FALSE(matches(extra, R"({"id":"ab","x":"s"})"));
  EXPECT_FALSE(matches(extra, R"({"x":1})"));
  auto map = schema_grammar(R"({"type":"object","additionalProperties":{"type":"boolean"}})");
  EXPECT_TRUE(matches(map, R"({})"));
  EXPECT_TRUE(matches(map, R"({"a":true,"b":false})"));

  auto any = std::make_shared<const text::Grammar>(text::json_object_grammar());
  EXPECT_TRUE(matches(any, R"({"a":[1,{"b":null}],"c":"d", "e": -1.5e3})"));
  EXPECT_TRUE(matches(any, "{}"));
  EXPECT_FALSE(matches(any, "[]"));
  EXPECT_FALSE(matches(any, R"({"a":})"));
}

TEST(JsonSchemaGrammar, ErrorsNameTheKeyword) {
  EXPECT_EQ(error_path(R"({"type":"string","pattern":"^[a-z]+$"})", false), "pattern");
  EXPECT_EQ(error_path(R"({"type":"string","pattern":".*"})", true), "<none>");
  EXPECT_EQ(error_path(R"({"properties":{"a":{"type":"integer","minimum":3}}})", true),
            "properties.a.minimum");
  EXPECT_EQ(error_path(R"({"properties":{"a":{"type":"integer","minimum":3}}})", false), "<none>");
  EXPECT_EQ(error_path(R"({"properties":{"a":{"type":"date"}}})", false), "properties.a.type");
  EXPECT_EQ(error_path(R"({"anyOf":[{"type":"string"},{"format":"email"}]})", true),
            "anyOf[1].format");
  EXPECT_EQ(error_path(R"({"$ref":"#/$defs/missing"})", false), "$ref");
  EXPECT_EQ(error_path(R"({"$ref":"http://example.com/s.json"})", false), "$ref");
  EXPECT_EQ(error_path(R"({"type":"array","items":[{"type":"string"}]})", false), "items");
  EXPECT_EQ(error_path(R"({"type":"array","maxItems":100000})", false), "maxItems");
  EXPECT_EQ(error_path(R"({"type":"string","minLength":5,"maxLength":2})", false), "minLength");
  EXPECT_EQ(error_path(R"({"enum":[]})", false), "enum");
  EXPECT_EQ(error_path(R"({"properties":{"a":{"allOf":[]}}})", true), "properties.a.allOf");
  EXPECT_EQ(
      error_path(
          R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"$ref":"#/$defs/a"},{"type":"integer"}]}},"$ref":"#/$defs/a"})",
          false),
      "");  // left recursion: refused instead of an exponential expansion
  EXPECT_EQ(error_path(R"({"$ref":"#"})", false), "$ref");
  for (const std::string& s : test_schemas()) EXPECT_EQ(error_path(s, true), "<none>") << s;
}

TEST(GrammarMask, TrieMaskEqualsTokenByTokenMatching) {
  // A vocabulary with shared prefixes; the trie mask must equal feeding each
  // token's bytes to a fresh copy of the matcher.
  std::vector<std::string> vocab = {"{", "}",   "\"",   "\"a", "\"a\"", "a",    ":",    ":1",
                                    "1", "12",  ",",    "{\"", "\"}",   "true", "tr",   "x",
                                    " ", "\"b", "b\":", "",    "{}",    "1}",   "null", "\xC3"};
  std::vector<uint8_t> usable(vocab.size(), 1);
  text::TokenTrie trie(vocab, usable);
  auto g = schema_grammar(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"}}})");
  text::MaskCache cache;
  std::vector<std::string> paths = {
      "", "{", "{\"a", "{\"a\":", "{\"a\":1", "{\"a\":1,\"b\":tr", "{\"b\":true"};
  for (const std::string& p : paths) {
    text::GrammarMatcher m(g);
    ASSERT_TRUE(m.accept(p)) << p;
    for (int pass = 0; pass < 2; ++pass) {  // the second pass hits the cache
      auto mask = m.mask(trie, &cache);
      for (size_t id = 0; id < vocab.size(); ++id) {
        text::GrammarMatcher copy(g);
        copy.accept(p);
        const bool want = !vocab[id].empty() && copy.accept(vocab[id]);
        EXPECT_EQ(mask->allows(int32_t(id)), want)
            << "after '" << p << "' token '" << vocab[id] << "'";
      }
      EXPECT_EQ(mask->can_end, p == "{\"b\":true" ? false : m.accepting());
    }
  }
  EXPECT_GT(cache.hits(), 0u);
}

// ---- constrained decoding with a random-weight model ----

namespace {

struct Decoded {
  std::string text;
  FinishReason finish = FinishReason::None;
  std::string error;
};

Decoded drain(RequestHandle& h, double limit_s = 120.0) {
  Decoded d;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit_s) {
    auto e = h.next(0.05);
    if (!e) continue;
    d.text += e->text;
    if (e->finish != FinishReason::None) {
      d.finish = e->finish;
      d.error = e->error;
      return d;
    }
  }
  ADD_FAILURE() << "request not terminal after " << limit_s << " s";
  return d;
}

}  // namespace

TEST(StructuredOutputEngine, RandomModelAlwaysWritesValidJson) {
  const std::string dir = test::vision_model_dir("gemma3");
  auto model = load_model(dir);
  auto mt = server::ModelText::load(dir);
  ASSERT_TRUE(mt);
  auto vocab = mt->token_vocab();
  EngineConfig cfg;
  cfg.threads = 2;
  Engine engine(*model, cfg, mt.get());
  const std::vector<int32_t> prompt = mt->text_prompt("Reply in JSON.");
  int runs = 0;
  for (const std::string& schema_text : test_schemas()) {
    const ojson schema = ojson::parse(schema_text);
    server::ResponseFormat rf;
    rf.type = server::ResponseFormat::Type::JsonSchema;
    rf.strict = true;
    auto factory = server::make_constraint(rf, schema, vocab);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (uint64_t seed : {1, 2, 3, 4}) {
      GenerationParams p;
      p.sampling.temperature = 1.0f;
      p.sampling.seed = seed;
      p.max_tokens = 4000;
      p.constraint = factory;
      handles.push_back(engine.submit(prompt, p));
    }
    for (auto& h : handles) {
      const Decoded d = drain(*h);
      ASSERT_EQ(d.finish, FinishReason::Stop) << schema_text << "\n" << d.text << "\n" << d.error;
      ojson v;
      ASSERT_NO_THROW(v = ojson::parse(d.text)) << schema_text << "\n" << d.text;
      std::string why;
      EXPECT_TRUE(validate(v, schema, schema, why)) << schema_text << "\n" << d.text << "\n" << why;
      ++runs;
    }
  }
  EXPECT_EQ(runs, int(test_schemas().size()) * 4);

  // json_object, greedy and sampled: any object (bounded by max_tokens; a
  // finished one parses).
  server::ResponseFormat obj;
  obj.type = server::ResponseFormat::Type::JsonObject;
  auto factory = server::make_constraint(obj, {}, vocab);
  for (float t : {0.0f, 1.0f}) {
    GenerationParams p;
    p.sampling.temperature = t;
    p.sampling.seed = 9;
    p.max_tokens = 300;
    p.constraint = factory;
    const Decoded d = drain(*engine.submit(prompt, p));
    ASSERT_TRUE(d.finish == FinishReason::Stop || d.finish == FinishReason::Length) << d.error;
    text::GrammarMatcher m(std::make_shared<const text::Grammar>(text::json_object_grammar()));
    EXPECT_TRUE(m.accept(d.text)) << d.text;
    if (d.finish == FinishReason::Stop) {
      EXPECT_TRUE(ojson::parse(d.text).is_object()) << d.text;
    }
  }
}

// ---- over HTTP ----

TEST(StructuredOutputServer, ChatWithResponseFormatOnBothLanes) {
  using namespace tandem::test;
  const std::string dir = vision_model_dir("gemma3");
  ChildServer srv({dir, "--threads", "2"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  const std::string schema_text = test_schemas()[0];
  const json schema = json::parse(schema_text);  // keys sorted
  const std::string image =
      "data:image/png;base64," + base64(file_bytes(vision_fixture_dir("gemma3") + "/input_0.png"));
  const json text_msg = json::array({{{"role", "user"}, {"content", "Who? Reply in JSON."}}});
  const json image_msg = json::array(
      {{{"role", "user"},
        {"content", json::array({{{"type", "text"}, {"text", "Describe it in JSON."}},
                                 {{"type", "image_url"}, {"image_url", {{"url", image}}}}})}}});
  for (const json& messages : {text_msg, image_msg})
    for (int seed : {1, 2}) {
      ojson body = {
          {"messages", ojson::parse(messages.dump())},
          {"temperature", 1.0},
          {"seed", seed},
          {"max_tokens", 2000},
          {"response_format",
           {{"type", "json_schema"},
            {"json_schema",
             {{"name", "person"}, {"strict", true}, {"schema", ojson::parse(schema_text)}}}}}};
      // The body keeps the schema's key order: properties come out in it.
      auto r = http_post(srv.port(), "/v1/chat/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.raw;
      EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
      const std::string content = r.body["choices"][0]["message"]["content"];
      ojson v;
      ASSERT_NO_THROW(v = ojson::parse(content)) << content;
      std::string why;
      const ojson s = ojson::parse(schema_text);
      EXPECT_TRUE(validate(v, s, s, why)) << content << " " << why;
      // The same through a stream (the same body, key order included).
      body["stream"] = true;
      auto st = post_stream(srv.port(), "/v1/chat/completions", json::parse(body.dump()));
      ASSERT_EQ(st.status, 200) << st.raw;
      std::string streamed;
      for (const json& e : st.events)
        if (e.contains("choices") && !e["choices"].empty())
          streamed += e["choices"][0]["delta"].value("content", "");
      // post_stream sends the body with sorted keys ("age" before "name").
      ojson sv;
      ASSERT_NO_THROW(sv = ojson::parse(streamed)) << streamed;
      const ojson sorted = ojson::parse(schema.dump());
      EXPECT_TRUE(validate(sv, sorted, sorted, why)) << streamed << " " << why;
      EXPECT_EQ(st.finish_reason(), "stop");
    }
  const json status = http_get(srv.port(), "/v1/status").body;
  EXPECT_GE(status["vision_lane_requests"].get<int>(), 4);
  EXPECT_GE(status["text_lane_requests"].get<int>(), 4);

  // json_object on /v1/completions.
  auto c = post_json(srv.port(), "/v1/completions",
                     {{"prompt", "JSON:"},
                      {"max_tokens", 200},
                      {"temperature", 0},
                      {"response_format", {{"type", "json_object"}}}});
  ASSERT_EQ(c.status, 200) << c.raw;
  text::GrammarMatcher m(std::make_shared<const text::Grammar>(text::json_object_grammar()));
  EXPECT_TRUE(m.accept(c.body["choices"][0]["text"].get<std::string>())) << c.raw;

  // Bad formats: 400 naming the field.
  struct Bad {
    json format;
    std::string param;
  };
  const std::vector<Bad> bad = {
      {json::parse(R"("json")"), "response_format"},
      {json::parse(R"({"type":"yaml"})"), "response_format.type"},
      {json::parse(R"({"type":"json_schema"})"), "response_format.json_schema"},
      {json::parse(R"({"type":"json_schema","json_schema":{"name":"x"}})"),
       "response_format.json_schema.schema"},
      {json::parse(
           R"({"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer","minimum":1}}}}})"),
       "response_format.json_schema.schema.properties.a.minimum"},
      {json::parse(
           R"({"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"^[0-9]+$"}}})"),
       "response_format.json_schema.schema.pattern"},
  };
  for (const Bad& b : bad) {
    auto r = post_json(srv.port(), "/v1/chat/completions",
                       {{"messages", text_msg}, {"max_tokens", 5}, {"response_format", b.format}});
    EXPECT_EQ(r.status, 400) << b.format.dump() << " " << r.raw;
    EXPECT_EQ(r.body["error"]["param"], b.param) << r.raw;
  }
}

// The bytes per token (text/token_bytes.h) on the real vocabularies, when
// cached (scripts/fetch_tokenizers.sh): concatenated over an encoding they
// give back the text, byte for byte.
TEST(TokenBytes, RealVocabulariesSpellTheirEncodings) {
  const char* home = std::getenv("HOME");
  int tried = 0;
  for (const char* name : {"gemma3", "qwen3", "llama3_1"}) {
    const std::string dir = std::string(home ? home : "") + "/.cache/tandem/tokenizers/" + name;
    if (test::file_bytes(dir + "/tokenizer.json").empty()) continue;
    ++tried;
    const text::Tokenizer tok = text::Tokenizer::load(dir);
    const text::TokenBytes tb = text::token_bytes(tok);
    for (const std::string& s :
         {std::string(R"({"name": "Zoë", "tags": ["日本語", "emoji 🙂"], "n": -1.5e3})"),
          std::string("  leading spaces\nand\ttabs \\u00e9 \"quoted\"")}) {
      std::string spelled;
      for (int32_t id : tok.encode(s, false)) {
        EXPECT_TRUE(tb.usable[size_t(id)]) << name << " id " << id;
        spelled += tb.bytes[size_t(id)];
      }
      EXPECT_EQ(spelled, s) << name;
    }
  }
  if (tried == 0) GTEST_SKIP() << "no cached tokenizers";
}
