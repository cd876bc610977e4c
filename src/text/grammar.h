// Byte-level context-free grammars for constrained decoding, and the token
// masks they induce over a vocabulary.
//
//  - Grammar: rules of alternatives, each a sequence of byte classes and rule
//    references (no left recursion; a reference last in its alternative is a
//    tail call, so right-recursive loops keep the stack flat). Built by
//    text/json_schema_grammar.h.
//  - GrammarMatcher: a pushdown recognizer over bytes (a set of stacks, one
//    per live parse; each stack's top is a byte class). accept() feeds bytes
//    atomically (all or nothing).
//  - TokenTrie: a vocabulary's token byte strings (computed once per
//    tokenizer, text/token_bytes.h) as a trie in preorder, so the mask step
//    walks shared prefixes once and skips a whole subtree at the first
//    rejected byte.
//  - MaskCache: masks keyed by the matcher's exact state (its stacks), shared
//    by the sequences of one compiled grammar; a state seen before (inside a
//    long string, between array items) costs a hash lookup.
// Not thread-safe except MaskCache (internally locked).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::text {

using ByteClass = std::array<uint64_t, 4>;

struct Grammar {
  enum Kind : uint8_t { Chars, Ref, End };
  struct Elem {
    Kind kind;
    int32_t arg;  // Chars: class index; Ref: rule index
  };
  std::vector<Elem> elems;                  // alternatives, each ending with End
  std::vector<std::vector<int32_t>> rules;  // per rule: the start of each alternative
  std::vector<ByteClass> classes;
  int32_t root = 0;

  bool has(int32_t cls, uint8_t b) const { return (classes[size_t(cls)][b >> 6] >> (b & 63)) & 1; }
};

// True when some rule can reach itself without consuming a byte (a left
// recursion, which a recognizer of this kind cannot run).
bool left_recursive(const Grammar& g);

// Builds a Grammar: rules are created empty and given alternatives later, so
// rules may refer to each other (and themselves) freely.
class GrammarBuilder {
 public:
  struct Sym {
    bool ref;
    int32_t id;  // class or rule
  };
  using Seq = std::vector<Sym>;

  int32_t rule();
  void alt(int32_t rule, const Seq& seq);
  Sym cls(const ByteClass& c);
  Sym byte(uint8_t b);
  Sym range(uint8_t lo, uint8_t hi);
  static Sym ref(int32_t rule) { return {true, rule}; }
  Seq lit(std::string_view s);
  // A rule matching `seq` or nothing; `seq` repeated zero or more times.
  int32_t opt(const Seq& seq);
  int32_t star(const Seq& seq);
  size_t size() const;  // alternatives' symbols so far
  Grammar build(int32_t root);

 private:
  std::vector<std::vector<Seq>> rules_;
  std::vector<ByteClass> classes_;
  std::unordered_map<std::string, int32_t> class_ids_;
  size_t size_ = 0;
};

// A vocabulary's tokens as a trie of their bytes, in preorder. Tokens with no
// bytes (special tokens, empty strings) are not in it.
class TokenTrie {
 public:
  // token_bytes[id]: the bytes token `id` writes; nullopt-like empty string
  // with `allowed[id] == 0` leaves it out.
  TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<uint8_t>& allowed);
  int32_t vocab() const { return vocab_; }
  size_t nodes() const { return byte_.size(); }

 private:
  friend class GrammarMatcher;
  int32_t vocab_ = 0;
  int32_t max_depth_ = 0;
  std::vector<uint8_t> byte_;
  std::vector<int32_t> depth_;  // 1-based
  std::vector<int32_t> end_;    // one past the node's subtree
  std::vector<int32_t>
      tok_begin_;  // tokens ending at the node: ids_[tok_begin_[i] .. tok_begin_[i+1])
  std::vector<int32_t> ids_;
};

// The tokens allowed in one matcher state: a bitset over the trie's
// vocabulary, whether the grammar may end here (end-of-sequence allowed), and
// whether any token is allowed.
struct TokenMask {
  std::vector<uint64_t> bits;
  bool can_end = false;
  bool any_token = false;
  bool allows(int32_t id) const {
    return id >= 0 && size_t(id >> 6) < bits.size() && ((bits[size_t(id >> 6)] >> (id & 63)) & 1);
  }
};

class MaskCache {
 public:
  explicit MaskCache(size_t capacity = 512) : capacity_(capacity) {}
  std::shared_ptr<const TokenMask> find(const std::vector<int32_t>& key);
  void put(const std::vector<int32_t>& key, std::shared_ptr<const TokenMask> mask);
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }

 private:
  struct Hash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };
  std::mutex mu_;
  size_t capacity_, hits_ = 0, misses_ = 0;
  std::unordered_map<std::vector<int32_t>, std::shared_ptr<const TokenMask>, Hash> map_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> g);

  // Feeds bytes; false (state unchanged) when the grammar rejects them.
  bool accept(std::string_view bytes);
  // The whole input so far is a sentence of the grammar.
  bool accepting() const { return accepting_; }
  // Some byte may still follow.
  bool can_continue() const { return !tops_.empty(); }

  // The tokens of `trie` whose bytes the grammar accepts next (in full), with
  // the cache when given.
  std::shared_ptr<const TokenMask> mask(const TokenTrie& trie, MaskCache* cache = nullptr);

  // The state as a key (the stacks, bottom to top, separated by -1).
  std::vector<int32_t> state_key() const;

 private:
  struct Node {
    int32_t pos, parent;
  };
  void expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, bool& acc, int depth);
  void advance(const std::vector<int32_t>& tops, uint8_t b, std::vector<int32_t>& out, bool& acc);
  void compact();  // keeps only the nodes the current tops reach

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tops_;
  bool accepting_ = false;
  std::vector<int32_t> scratch_;
};

}  // namespace tandem::text
