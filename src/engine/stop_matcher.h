// Stop strings in streamed text, matched across chunk boundaries and never
// emitted: text that could still be the start of a stop string is held back
// until the following text rules it out.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends `text` and returns what can be emitted now. Once a stop string
  // is found, stopped() is true and the text before it is the last returned.
  std::string push(std::string_view text);
  // End of stream: returns everything still held back (nothing once stopped).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tandem
