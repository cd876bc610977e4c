// Template errors: a syntax error, raise_exception(), or a runtime type error.
// Each carries the template's message and the 1-based line it happened on.
#pragma once

#include <string>

#include "core/error.h"

namespace tandem::jinja {

class TemplateError : public tandem::Error {
 public:
  TemplateError(const std::string& message, int line)
      : tandem::Error(format(message, line)), message_(message), line_(line) {}
  const std::string& message() const { return message_; }
  int line() const { return line_; }

 private:
  static std::string format(const std::string& m, int line) {
    return "chat template error (line " + std::to_string(line) + "): " + m;
  }
  std::string message_;
  int line_;
};

}  // namespace tandem::jinja
