// Python's operators over template values: arithmetic, comparison, `in`,
// attribute and item access (Jinja's sandboxed getattr/getitem rules),
// slicing, iteration and len(). Errors throw tandem::Error with Python's
// message; the interpreter adds the template line.
#pragma once

#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace tandem::jinja {

class Interpreter;

std::string undefined_message(const Value& u);
[[noreturn]] void undefined_error(const Value& u);

Value binary_op(const std::string& op, const Value& a, const Value& b);
Value negate(const Value& v);
bool py_less(const Value& a, const Value& b);  // a < b, or TypeError
bool compare(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);

Value getattr(const Value& obj, const std::string& name);
Value getitem(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

std::vector<Value> iterate(const Value& v);
int64_t length(const Value& v);

// Bound methods of str, dict and list (str.strip, dict.items, ...). Returns
// false when `name` is not a method of that type.
bool find_method(const Value& self, const std::string& name, Value& out);

}  // namespace tandem::jinja
