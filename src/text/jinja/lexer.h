// Splits a template into data and tag tokens the way Jinja's lexer does,
// including whitespace control (`-`, `+`) and the trim_blocks/lstrip_blocks
// environment settings that transformers renders chat templates with.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError on malformed input (unterminated tags, bad chars).
std::vector<Token> tokenize(std::string_view source, const LexOptions& opts = {});

}  // namespace tandem::jinja
