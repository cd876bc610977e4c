// Pre-tokenizers of the HF `tokenizers` format ("pre_tokenizer" in
// tokenizer.json): split normalized text into the pieces ("words") that the
// BPE model encodes independently.
//
// Supported: Sequence, Split (String or Regex pattern; behaviors Removed,
// Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert),
// ByteLevel (add_prefix_space, use_regex), Metaspace (replacement,
// prepend_scheme / add_prefix_space, split), Digits (individual_digits).
// ByteLevel must come last: instead of rewriting the text into the byte-level
// alphabet it marks the result `byte_level`, and the BPE model maps raw bytes
// to that alphabet's tokens itself (same ids, no string rewrite).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::text {

struct PreTokenized {
  std::string buf;                                    // normalized text
  std::vector<std::pair<uint32_t, uint32_t>> pieces;  // [begin, end) ranges in buf, in order
  bool byte_level = false;                            // pieces are raw bytes for a byte-level BPE
  bool at_start = true;  // buf begins the whole input (Metaspace "first")

  std::string_view piece(size_t i) const {
    return std::string_view(buf).substr(pieces[i].first, pieces[i].second - pieces[i].first);
  }
  // Sets buf = text and one piece covering it (none when text is empty).
  void reset(std::string text, bool start);
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(PreTokenized& pt) const = 0;
  virtual bool is_byte_level() const { return false; }

  // nullptr for JSON null (the whole stretch is one piece).
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& j);
  // A Split with an Isolated regex followed by byte-level marking, as tiktoken
  // (and so tekken) does.
  static std::unique_ptr<PreTokenizer> tiktoken_style(const std::string& pattern);
};

// How a Split treats the delimiters it finds (HF SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// Splits one range given the delimiter matches inside it (sorted, disjoint,
// non-empty, absolute offsets); appends the resulting non-empty ranges.
void split_range(std::pair<uint32_t, uint32_t> range,
                 const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                 bool invert, std::vector<std::pair<uint32_t, uint32_t>>& out);

}  // namespace tandem::text
