// Builds the syntax tree from tokens, following Jinja's grammar and operator
// precedence. Like Jinja's compiler, it rejects unknown filters and tests at
// parse time unless they sit inside an `if` (there Jinja defers the error to
// the moment they run).
#pragma once

#include <string_view>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace tandem::jinja {

// Throws TemplateError on syntax errors.
TemplateAst parse(std::string_view source, const LexOptions& opts = {});

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

}  // namespace tandem::jinja
