// Post-parse passes over the syntax tree (see parse_checks.cpp).
#pragma once

#include "text/jinja/ast.h"

namespace tandem::jinja {

// Sets m.uses_varargs / uses_kwargs / uses_caller from the names its body reads.
void scan_macro_body(Stmt& m);
// Throws TemplateError for an unknown filter or test outside `if` bodies and
// conditional expressions, as Jinja's compiler does.
void check_names(const TemplateAst& ast);

}  // namespace tandem::jinja
