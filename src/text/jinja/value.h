// The value model of the template language: Python's objects as the chat
// templates see them (None, bool, int, float, str, list/tuple, dict), plus
// Jinja's Undefined, namespaces, loop objects and callables.
//
// Lists, dicts and objects have reference semantics like Python (copying a
// Value shares them); scalars and strings are copied.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::jinja {

class Interpreter;
struct Value;

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object, Func };

struct ListObj {
  std::vector<Value> items;
  bool tuple = false;
  // Non-null for the lazy iterators Jinja's filters return ("generator",
  // "list_reverseiterator"): always truthy, no len(), not subscriptable, and
  // exhausted after one iteration.
  const char* gen_type = nullptr;
  bool consumed = false;
  std::string deferred_error;  // a lazy filter's error, raised when iterated
};

struct DictObj {
  std::vector<std::pair<Value, Value>> items;  // insertion order, like Python
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value v);
};

// Objects with attributes: namespace(), the loop variable, ...
struct Object {
  virtual ~Object() = default;
  virtual const char* type_name() const = 0;
  // Returns false when the attribute does not exist.
  virtual bool get_attr(std::string_view name, Value& out) = 0;
  virtual bool set_attr(std::string_view name, const Value& v) { return false; }
  virtual std::string repr() const;
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Removes and returns a keyword argument, or nullptr.
  const Value* kwarg(std::string_view name) const;
};

struct Func {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
  bool is_macro = false;
};

struct Value {
  Kind kind = Kind::Undefined;
  bool safe = false;  // markupsafe.Markup string
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String payload; for Undefined, the message of its error
  std::shared_ptr<ListObj> list;
  std::shared_ptr<DictObj> dict;
  std::shared_ptr<Object> obj;
  std::shared_ptr<Func> fn;

  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v, bool safe = false);
  static Value new_list(std::vector<Value> items = {}, bool tuple = false);
  static Value new_dict();
  static Value object(std::shared_ptr<Object> o);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List && !list->gen_type; }
  bool is_generator() const { return kind == Kind::List && list->gen_type; }
  bool is_dict() const { return kind == Kind::Dict; }
  double as_double() const { return kind == Kind::Float ? f : double(kind == Kind::Bool ? b : i); }
  int64_t as_int() const { return kind == Kind::Bool ? int64_t(b) : i; }
};

// Python semantics.
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
const char* type_name(const Value& v);  // Python's type(x).__name__

// JSON (ordered objects) <-> Value. to_json fails on values JSON cannot hold.
Value from_json(const nlohmann::ordered_json& j);

}  // namespace tandem::jinja
