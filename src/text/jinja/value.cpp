#include "text/jinja/value.h"

#include "core/error.h"

namespace tandem::jinja {

const Value* DictObj::find(const Value& key) const {
  if (key.kind == Kind::String) {
    for (const auto& kv : items)
      if (kv.first.kind == Kind::String && kv.first.s == key.s) return &kv.second;
    return nullptr;
  }
  for (const auto& kv : items)
    if (equals(kv.first, key)) return &kv.second;
  return nullptr;
}

Value* DictObj::find(const Value& key) {
  return const_cast<Value*>(static_cast<const DictObj*>(this)->find(key));
}

void DictObj::set(const Value& key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

std::string Object::repr() const {
  return std::string("<") + type_name() + " object>";
}

const Value* CallArgs::kwarg(std::string_view name) const {
  for (const auto& kv : kw)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.kind = Kind::Undefined;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x, bool safe) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(x);
  v.safe = safe;
  return v;
}
Value Value::new_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<ListObj>();
  v.list->items = std::move(items);
  v.list->tuple = tuple;
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<DictObj>();
  return v;
}
Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.kind = Kind::Object;
  v.obj = std::move(o);
  return v;
}
Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Func;
  v.fn = std::make_shared<Func>();
  v.fn->name = std::move(name);
  v.fn->call = std::move(fn);
  return v;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0.0;
    case Kind::String: return !v.s.empty();
    case Kind::List: return v.list->gen_type || !v.list->items.empty();
    case Kind::Dict: return !v.dict->items.empty();
    case Kind::Object:
    case Kind::Func: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List: {
      if (a.list == b.list) return true;
      if (a.list->gen_type || b.list->gen_type) return false;
      if (a.list->tuple != b.list->tuple || a.list->items.size() != b.list->items.size())
        return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!equals(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* other = b.dict->find(kv.first);
        if (!other || !equals(kv.second, *other)) return false;
      }
      return true;
    }
    case Kind::Object: return a.obj == b.obj;
    case Kind::Func: return a.fn == b.fn;
    default: return false;
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return v.safe ? "Markup" : "str";
    case Kind::List: return v.list->gen_type ? v.list->gen_type : v.list->tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Object: return v.obj->type_name();
    case Kind::Func: return v.fn->is_macro ? "Macro" : "function";
  }
  return "object";
}

static Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > 512) fail("JSON input nested deeper than 512 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value::number(double(u));
      return Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value v = Value::new_list();
      v.list->items.reserve(j.size());
      for (const auto& e : j) v.list->items.push_back(from_json_at(e, depth + 1));
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::new_dict();
      v.dict->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        v.dict->items.emplace_back(Value::string(it.key()), from_json_at(it.value(), depth + 1));
      return v;
    }
    default: return Value::none();
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  return from_json_at(j, 0);
}

}  // namespace tandem::jinja
