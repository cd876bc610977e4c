#include "text/json_schema_grammar.h"

#include <cctype>
#include <map>
#include <set>

namespace tandem::text {

namespace {

using ojson = nlohmann::ordered_json;
using Seq = GrammarBuilder::Seq;
using Sym = GrammarBuilder::Sym;

constexpr int kMaxDepth = 64;
constexpr size_t kMaxGrammarSize = 2'000'000;

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> s = {
      "type",      "properties", "required", "additionalProperties",
      "items",     "enum",       "const",    "anyOf",
      "oneOf",     "minItems",   "maxItems", "minLength",
      "maxLength", "pattern",    "$ref",     "nullable"};
  return s;
}

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> s = {"title",    "description", "default",
                                          "examples", "$schema",     "$id",
                                          "$comment", "$defs",       "definitions"};
  return s;
}

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

Sym R(int32_t rule) {
  return GrammarBuilder::ref(rule);
}

Seq operator+(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& builder, const ojson* root, SchemaOptions o)
      : b(builder), root_(root), strict_(o.strict), opt_(std::move(o)) {}

  GrammarBuilder& b;

  void set_root(const ojson* root) {
    root_ = root;
    refs_.clear();
  }

  bool gemma() const { return opt_.syntax == ValueSyntax::Gemma4; }

  // A value written in the output's syntax (enum and const values, keys).
  std::string render(const ojson& v) const {
    if (!gemma()) return v.dump();
    if (v.is_string()) return opt_.quote + v.get<std::string>() + opt_.quote;
    if (v.is_object()) {
      std::string out = "{";
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (it != v.begin()) out += ",";
        out += key(it.key()) + ":" + render(it.value());
      }
      return out + "}";
    }
    if (v.is_array()) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + render(v[i]);
      return out + "]";
    }
    return v.dump();
  }

  // A property name: JSON's quoted string; Gemma 4's bare key when it is a
  // plain word (as its template writes them), else a quoted one.
  std::string key(const std::string& k) const {
    if (!gemma()) return nlohmann::json(k).dump();
    bool bare = !k.empty();
    for (char c : k)
      bare =
          bare && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
    return bare ? k : opt_.quote + k + opt_.quote;
  }

  // ---- building blocks ----

  int32_t ws() {
    if (ws_ < 0) ws_ = b.opt(gemma() ? Seq{} : b.lit(" "));  // Gemma 4: no spaces
    return ws_;
  }

  // Gemma 4's string characters: any UTF-8 code point, raw (no escapes); a
  // quote written as text (not one token) excludes '<'.
  int32_t gemma_char() {
    if (char_ >= 0) return char_;
    char_ = b.rule();
    ByteClass plain{};
    for (int c = 0x01; c < 0x80; ++c)
      if (c != '<' || opt_.quote.size() == 1) plain[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
    b.alt(char_, {b.cls(plain)});
    utf8_multibyte(char_);
    return char_;
  }

  void utf8_multibyte(int32_t r) {
    ByteClass e_mid{};
    for (int c = 0xE1; c <= 0xEF; ++c)
      if (c != 0xED) e_mid[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
    const Sym cont = b.range(0x80, 0xBF);
    b.alt(r, {b.range(0xC2, 0xDF), cont});
    b.alt(r, {b.byte(0xE0), b.range(0xA0, 0xBF), cont});
    b.alt(r, {b.cls(e_mid), cont, cont});
    b.alt(r, {b.byte(0xED), b.range(0x80, 0x9F), cont});
    b.alt(r, {b.byte(0xF0), b.range(0x90, 0xBF), cont, cont});
    b.alt(r, {b.range(0xF1, 0xF3), cont, cont, cont});
    b.alt(r, {b.byte(0xF4), b.range(0x80, 0x8F), cont, cont});
  }

  int32_t string_char() {
    if (gemma()) return gemma_char();
    if (char_ >= 0) return char_;
    char_ = b.rule();
    ByteClass plain{};
    for (int c = 0x20; c < 0x80; ++c)
      if (c != '"' && c != '\\') plain[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
    ByteClass esc{};
    for (char c : std::string("\"\\/bfnrt")) esc[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
    ByteClass hex{}, hex_nod{};
    for (char c : std::string("0123456789abcdefABCDEF")) {
      hex[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
      if (c != 'd' && c != 'D') hex_nod[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
    }
    const Sym h = b.cls(hex);
    b.alt(char_, {b.cls(plain)});
    b.alt(char_, {b.byte('\\'), b.cls(esc)});
    // \uXXXX, surrogates excluded (a lone one is not valid JSON text).
    b.alt(char_, {b.byte('\\'), b.byte('u'), b.cls(hex_nod), h, h, h});
    utf8_multibyte(char_);
    return char_;
  }

  // `n` nested optional copies of `item`: item (item (...)?)?
  int32_t upto(const Seq& item, int64_t n) {
    int32_t r = b.rule();
    b.alt(r, {});
    for (int64_t k = 0; k < n; ++k) r = b.opt(item + Seq{R(r)});
    return r;
  }

  int32_t string(int64_t min_len = 0, int64_t max_len = -1) {
    if (min_len == 0 && max_len < 0 && string_ >= 0) return string_;
    const Sym c = R(string_char());
    const Seq quote = b.lit(gemma() ? opt_.quote : "\"");
    Seq seq = quote;
    for (int64_t i = 0; i < min_len; ++i) seq.push_back(c);
    seq.push_back(R(max_len < 0 ? b.star({c}) : upto({c}, max_len - min_len)));
    seq = seq + quote;
    const int32_t r = b.rule();
    b.alt(r, seq);
    if (min_len == 0 && max_len < 0) string_ = r;
    return r;
  }

  int32_t digits() {
    if (digits_ < 0) digits_ = b.star({b.range('0', '9')});
    return digits_;
  }

  int32_t integer() {
    if (integer_ >= 0) return integer_;
    const int32_t body = b.rule();
    b.alt(body, b.lit("0"));
    // At most 18 digits: every integer written fits in int64.
    b.alt(body, {b.range('1', '9'), R(upto({b.range('0', '9')}, 17))});
    integer_ = b.rule();
    b.alt(integer_, {R(b.opt(b.lit("-"))), R(body)});
    return integer_;
  }

  int32_t number() {
    if (number_ >= 0) return number_;
    const int32_t frac = b.opt({b.byte('.'), b.range('0', '9'), R(digits())});
    ByteClass e{}, sign{};
    for (char c : std::string("eE")) e[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
    for (char c : std::string("+-")) sign[size_t(c >> 6)] |= uint64_t(1) << (c & 63);
    const int32_t exp =
        // At most two exponent digits: every number written is a finite double.
        b.opt(
            {b.cls(e), R(b.opt({b.cls(sign)})), b.range('0', '9'), R(b.opt({b.range('0', '9')}))});
    number_ = b.rule();
    b.alt(number_, {R(integer()), R(frac), R(exp)});
    return number_;
  }

  int32_t literal(const std::string& s) {
    const int32_t r = b.rule();
    b.alt(r, b.lit(s));
    return r;
  }

  int32_t boolean() {
    if (bool_ >= 0) return bool_;
    bool_ = b.rule();
    b.alt(bool_, b.lit("true"));
    b.alt(bool_, b.lit("false"));
    return bool_;
  }

  int32_t null() {
    if (null_ < 0) null_ = literal("null");
    return null_;
  }

  // Any JSON value; objects and arrays nest.
  int32_t any_value() {
    if (any_ >= 0) return any_;
    any_ = b.rule();
    const Seq member = {R(string()), b.byte(':'), R(ws()), R(any_)};
    const int32_t more_members = b.star(b.lit(",") + Seq{R(ws())} + member);
    const int32_t obj = b.rule();
    b.alt(obj, b.lit("{}"));
    b.alt(obj, b.lit("{") + member + Seq{R(more_members), b.byte('}')});
    const int32_t more_items = b.star({b.byte(','), R(ws()), R(any_)});
    const int32_t arr = b.rule();
    b.alt(arr, b.lit("[]"));
    b.alt(arr, {b.byte('['), R(any_), R(more_items), b.byte(']')});
    any_object_ = obj;
    for (int32_t r : {obj, arr, string(), number(), boolean(), null()}) b.alt(any_, {R(r)});
    return any_;
  }

  int32_t any_object() {
    any_value();
    return any_object_;
  }

  // ---- schemas ----

  [[noreturn]] void error(const std::string& path, const std::string& msg) {
    throw SchemaError(path, msg);
  }

  int64_t bound(const ojson& s, const char* key, const std::string& path, int64_t dflt) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      error(join(path, key), std::string("'") + key + "' must be a non-negative integer");
    if (it->get<int64_t>() > kMaxBound)
      error(join(path, key), std::string("'") + key + "' is at most " + std::to_string(kMaxBound) +
                                 " for structured outputs");
    return it->get<int64_t>();
  }

  int32_t compile(const ojson& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) error(path, "the schema is nested too deeply");
    if (b.size() > kMaxGrammarSize) error(path, "the schema is too large");
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      error(path, "the schema 'false' matches nothing");
    }
    if (!s.is_object()) error(path, "a schema must be an object");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (supported_keywords().count(k) || annotation_keywords().count(k)) continue;
      if (strict_)
        error(join(path, k), "the keyword '" + k +
                                 "' is not supported in strict structured outputs (remove it "
                                 "or set strict to false, where it is not enforced)");
    }
    if (auto it = s.find("$ref"); it != s.end()) return reference(*it, join(path, "$ref"), depth);
    if (auto it = s.find("pattern"); it != s.end() && !opt_.ignore_pattern) {
      const bool trivial =
          it->is_string() && (*it == ".*" || *it == "^.*$" || *it == "^(.*)$" || *it == "");
      if (!trivial)
        error(join(path, "pattern"),
              "'pattern' is not supported by structured outputs (use enum, or describe the "
              "format in the prompt)");
    }
    std::vector<int32_t> alts;
    if (auto it = s.find("const"); it != s.end()) {
      alts.push_back(literal(render(*it)));
    } else if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty())
        error(join(path, "enum"), "'enum' must be a non-empty array");
      const int32_t r = b.rule();
      for (const ojson& v : *it) b.alt(r, b.lit(render(v)));
      alts.push_back(r);
    } else if (s.contains("anyOf") || s.contains("oneOf")) {
      const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
      const ojson& list = s[key];
      if (!list.is_array() || list.empty())
        error(join(path, key), std::string("'") + key + "' must be a non-empty array of schemas");
      for (size_t i = 0; i < list.size(); ++i)
        alts.push_back(
            compile(list[i], join(path, key) + "[" + std::to_string(i) + "]", depth + 1));
    } else {
      std::vector<std::string> types;
      if (auto it = s.find("type"); it != s.end()) {
        if (it->is_string()) {
          types.push_back(it->get<std::string>());
        } else if (it->is_array() && !it->empty()) {
          for (const ojson& t : *it) {
            if (!t.is_string()) error(join(path, "type"), "'type' must be a string or strings");
            types.push_back(t.get<std::string>());
          }
        } else {
          error(join(path, "type"), "'type' must be a string or a non-empty array of strings");
        }
      } else if (s.contains("properties") || s.contains("additionalProperties") ||
                 s.contains("required")) {
        types.push_back("object");
      } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
        types.push_back("array");
      } else if (s.contains("minLength") || s.contains("maxLength")) {
        types.push_back("string");
      } else {
        alts.push_back(any_value());
      }
      for (const std::string& t : types) alts.push_back(typed(t, s, path, depth));
    }
    if (auto it = s.find("nullable"); it != s.end()) {
      if (!it->is_boolean()) error(join(path, "nullable"), "'nullable' must be a boolean");
      if (it->get<bool>()) alts.push_back(null());
    }
    if (alts.size() == 1) return alts[0];
    const int32_t r = b.rule();
    for (int32_t a : alts) b.alt(r, {R(a)});
    return r;
  }

  int32_t typed(const std::string& t, const ojson& s, const std::string& path, int depth) {
    if (t == "string") {
      const int64_t lo = bound(s, "minLength", path, 0);
      const int64_t hi = bound(s, "maxLength", path, -1);
      if (hi >= 0 && lo > hi) error(join(path, "minLength"), "'minLength' exceeds 'maxLength'");
      return string(lo, hi);
    }
    if (t == "integer") return integer();
    if (t == "number") return number();
    if (t == "boolean") return boolean();
    if (t == "null") return null();
    if (t == "object") return object(s, path, depth);
    if (t == "array") return array(s, path, depth);
    error(join(path, "type"), "unknown type '" + t +
                                  "' (expected object, array, string, number, integer, "
                                  "boolean or null)");
  }

  int32_t object(const ojson& s, const std::string& path, int depth) {
    struct Prop {
      std::string name;
      int32_t value;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) error(join(path, "required"), "'required' must be an array of names");
      for (const ojson& n : *it) {
        if (!n.is_string()) error(join(path, "required"), "'required' must be an array of names");
        required.insert(n.get<std::string>());
      }
    }
    std::set<std::string> listed;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) error(join(path, "properties"), "'properties' must be an object");
      for (auto p = it->begin(); p != it->end(); ++p) {
        listed.insert(p.key());
        props.push_back({p.key(),
                         compile(p.value(), join(join(path, "properties"), p.key()), depth + 1),
                         required.count(p.key()) > 0});
      }
    }
    for (const std::string& n : required)
      if (!listed.count(n)) props.push_back({n, any_value(), true});
    int32_t extra = -1;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) {
        if (it->get<bool>()) extra = any_value();
      } else {
        extra = compile(*it, join(path, "additionalProperties"), depth + 1);
      }
    }
    // T[i]: properties i.. after something was written (each needs a comma);
    // F[i]: the same with nothing written yet.
    const size_t n = props.size();
    std::vector<int32_t> T(n + 1), F(n + 1);
    if (extra >= 0) {
      const Seq kv = {R(string()), b.byte(':'), R(ws()), R(extra)};
      T[n] = b.star(Seq{b.byte(','), R(ws())} + kv);
      F[n] = b.opt(kv + Seq{R(T[n])});
    } else {
      T[n] = F[n] = b.rule();
      b.alt(T[n], {});
    }
    for (size_t i = n; i-- > 0;) {
      const Seq kv = b.lit(key(props[i].name)) + Seq{b.byte(':'), R(ws()), R(props[i].value)};
      T[i] = b.rule();
      F[i] = b.rule();
      b.alt(T[i], Seq{b.byte(','), R(ws())} + kv + Seq{R(T[i + 1])});
      b.alt(F[i], kv + Seq{R(T[i + 1])});
      if (!props[i].required) {
        b.alt(T[i], {R(T[i + 1])});
        b.alt(F[i], {R(F[i + 1])});
      }
    }
    const int32_t r = b.rule();
    b.alt(r, {b.byte('{'), R(F[0]), b.byte('}')});
    return r;
  }

  int32_t array(const ojson& s, const std::string& path, int depth) {
    int32_t item;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array())
        error(join(path, "items"), "'items' as an array (tuples) is not supported");
      item = compile(*it, join(path, "items"), depth + 1);
    } else {
      item = any_value();
    }
    const int64_t lo = bound(s, "minItems", path, 0);
    const int64_t hi = bound(s, "maxItems", path, -1);
    if (hi >= 0 && lo > hi) error(join(path, "minItems"), "'minItems' exceeds 'maxItems'");
    const int32_t r = b.rule();
    if (hi == 0) {
      b.alt(r, b.lit("[]"));
      return r;
    }
    const Seq next = {b.byte(','), R(ws()), R(item)};
    const int32_t tail = hi < 0 ? b.star(next) : upto(next, hi - std::max<int64_t>(lo, 1));
    Seq seq = b.lit("[");
    if (lo > 0) {
      seq.push_back(R(item));
      for (int64_t k = 1; k < lo; ++k) seq = seq + next;
      seq.push_back(R(tail));
    } else {
      seq.push_back(R(b.opt({R(item), R(tail)})));
    }
    seq.push_back(b.byte(']'));
    b.alt(r, seq);
    return r;
  }

  int32_t reference(const ojson& ref, const std::string& path, int depth) {
    if (!ref.is_string()) error(path, "'$ref' must be a string");
    const std::string target = ref.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    const ojson* def = nullptr;
    std::string def_path;
    if (target == "#") {
      def = root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (target.compare(0, p.size(), p) != 0) continue;
        std::string name = target.substr(p.size());
        // JSON pointer escapes.
        for (size_t k = 0; (k = name.find('~', k)) != std::string::npos; ++k)
          name.replace(k, 2, name.compare(k, 2, "~1") == 0 ? "/" : "~");
        const std::string section = p.substr(2, p.size() - 3);
        auto sec = root_->find(section);
        if (sec != root_->end() && sec->is_object() && sec->contains(name)) {
          def = &(*sec)[name];
          def_path = section + "." + name;
        }
      }
    }
    if (!def)
      error(path, "'$ref' \"" + target +
                      "\" is not supported or not found (only \"#\", \"#/$defs/<name>\" and "
                      "\"#/definitions/<name>\" are)");
    const int32_t r = b.rule();
    refs_[target] = r;
    const int32_t body = compile(*def, def_path, depth + 1);
    if (body == r) error(path, "'$ref' \"" + target + "\" refers to itself");
    b.alt(r, {R(body)});
    return r;
  }

 private:
  const ojson* root_;
  bool strict_;
  SchemaOptions opt_;
  std::map<std::string, int32_t> refs_;
  int32_t ws_ = -1, char_ = -1, string_ = -1, digits_ = -1, integer_ = -1, number_ = -1, bool_ = -1,
          null_ = -1, any_ = -1, any_object_ = -1;
};

SchemaRules::SchemaRules(GrammarBuilder& b, SchemaOptions o)
    : c_(std::make_unique<SchemaCompiler>(b, nullptr, std::move(o))) {}

SchemaRules::~SchemaRules() = default;

int32_t SchemaRules::schema(const nlohmann::ordered_json& s) {
  c_->set_root(&s);
  const int32_t r = c_->compile(s, "", 0);
  c_->set_root(nullptr);
  return r;
}

int32_t SchemaRules::any_object() {
  return c_->any_object();
}

std::string SchemaRules::render(const nlohmann::ordered_json& v) const {
  return c_->render(v);
}

void check_not_left_recursive(const Grammar& g) {
  if (left_recursive(g))
    throw SchemaError("",
                      "the schema refers to itself before writing anything (a $ref cycle "
                      "through anyOf/oneOf or $ref alone); it cannot be generated");
}

Grammar json_object_grammar() {
  GrammarBuilder b;
  const int32_t root = SchemaRules(b, {}).any_object();
  return b.build(root);
}

Grammar json_value_grammar() {
  GrammarBuilder b;
  SchemaCompiler c(b, nullptr, {});
  const int32_t root = c.any_value();
  return b.build(root);
}

Grammar compile_json_schema(const nlohmann::ordered_json& schema, bool strict) {
  GrammarBuilder b;
  SchemaOptions o;
  o.strict = strict;
  const int32_t root = SchemaRules(b, o).schema(schema);
  Grammar g = b.build(root);
  check_not_left_recursive(g);
  return g;
}

}  // namespace tandem::text
