// The engine's view of detokenization: generated ids in, text out,
// incrementally. The text layer (tokenizer issue) implements it; without
// one, requests stream ids only and stop strings are rejected.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

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
};

}  // namespace tandem
