// Entry points of the builtin filters, tests and globals.
#pragma once

#include <string>

#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace tandem::jinja {

// Jinja's filters plus transformers' tojson. Throws for unknown names.
Value builtin_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
// Jinja's tests (`x is name`). Throws for unknown names.
bool builtin_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
// range, namespace, dict, raise_exception, strftime_now, joiner, cycler.
void install_globals(Scope& root);

}  // namespace tandem::jinja
