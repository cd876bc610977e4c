// A parsed Jinja template, rendered the way transformers renders chat
// templates (trim_blocks, lstrip_blocks, loop controls, sandboxed).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/jinja/value.h"

namespace tandem::jinja {

struct RenderOptions {
  RenderLimits limits;
  Interpreter::Clock clock;  // local time for strftime_now; empty = now
};

class Template {
 public:
  // Parses the source; throws TemplateError (a tandem::Error) with the line.
  explicit Template(std::string_view source, const LexOptions& lex = {});

  // Renders with the given top-level variables. Throws TemplateError.
  std::string render(const std::vector<std::pair<std::string, Value>>& vars,
                     const RenderOptions& opts = {}) const;

 private:
  std::shared_ptr<const TemplateAst> ast_;
};

}  // namespace tandem::jinja
