// The engine's view of detokenization: generated ids in, text out,
// incrementally. The text layer (tokenizer issue) implements it; without
// one, requests stream ids only and stop strings are rejected.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

class TextStream {
 public:
  virtual ~TextStream() = default;
  // Text completed by this token (may be empty while a UTF-8 sequence is
  // incomplete). Concatenating every push() and flush() gives the full text.
  virtual std::string push(int32_t id) = 0;
  virtual std::string flush() = 0;
};

class TextStreamer {
 public:
  virtual ~TextStreamer() = default;
  virtual std::unique_ptr<TextStream> start() const = 0;
  // A stream that also writes the text of the special tokens in
  // `keep_special` (the reasoning and tool-call markers some models write
  // as special tokens, for the server's output parsers); other special
  // tokens are skipped as by start(). Default: start().
  virtual std::unique_ptr<TextStream> start_keeping(
      const std::vector<int32_t>& keep_special) const {
    (void)keep_special;
    return start();
  }
};

}  // namespace tandem
