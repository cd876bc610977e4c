#include "text/jinja/template.h"

#include <ctime>

#include "text/jinja/parser.h"

namespace tandem::jinja {

Template::Template(std::string_view source, const LexOptions& lex)
    : ast_(std::make_shared<TemplateAst>(parse(source, lex))) {}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& vars,
                             const RenderOptions& opts) const {
  Interpreter::Clock clock = opts.clock;
  if (!clock) {
    clock = [] {
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      return tm;
    };
  }
  Interpreter in(*ast_, opts.limits, clock);
  return in.render(vars);
}

}  // namespace tandem::jinja
