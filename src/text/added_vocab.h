// Added tokens ("added_tokens" in tokenizer.json; special tokens of tekken):
// strings that are cut out of the input before normalization and BPE and
// become one id each, as the HF `tokenizers` AddedVocabulary does.
//
// Matching is leftmost-longest over all tokens (a byte trie walked from each
// candidate position; a first-byte filter skips the rest). Tokens with
// normalized=false are matched in the raw input; normalized=true ones in each
// normalized stretch. Per token: lstrip/rstrip swallow the whitespace on that
// side into the match; single_word accepts a match only when no word
// character touches it on either side (a rejected match is skipped, the
// search goes on after it, as the Aho-Corasick iterator does).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct Segment {
  size_t begin, end;  // byte range in the matched text
  int32_t id = -1;    // the added token's id, or -1 for plain text
};

class AddedVocab {
 public:
  void add(const AddedToken& t);  // a later token with the same content replaces it
  // Builds the tries; call after the last add().
  void build();

  // Splits text into plain and token segments covering it. `normalized`
  // selects which tokens take part (see above).
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;

  bool has_normalized() const { return has_norm_; }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Trie {
    struct Node {
      int32_t token = -1;  // index into tokens_ of a token ending here
      std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    };
    std::vector<Node> nodes{Node{}};
    bool first[256] = {};
    void insert(const std::string& s, int32_t token);
    // Index of the longest token matching at text[i], or -1; its length in *len.
    int32_t longest(std::string_view text, size_t i, size_t* len) const;
  };
  void split_with(const Trie& trie, std::string_view text, std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;
  Trie raw_, norm_;
  bool has_norm_ = false, has_raw_ = false;
};

}  // namespace tandem::text
