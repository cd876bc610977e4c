// The BPE model: turns one pre-tokenized piece into token ids, exactly as the
// HF `tokenizers` BPE model does (and as tiktoken does for tekken files).
//
// Algorithm: the piece is split into initial symbols (characters looked up in
// the vocab, or, for byte-level pieces, raw bytes mapped to the byte-level
// alphabet's tokens), then the adjacent pair with the lowest merge rank is
// merged, leftmost first, until no pair has a merge. Merges are looked up in
// an open-addressing hash map keyed by the pair of ids; short pieces use a
// linear scan over cached pair ranks, long ones a priority queue over a
// linked list. Results for pieces up to kMaxCachedPiece bytes are cached
// (piece -> ids), guarded by a mutex so one model serves many threads.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map (id_a, id_b) -> (rank, merged id).
class MergeMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  // Keeps the first (lowest-rank) insertion for a key.
  void insert(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    uint64_t k = key(a, b);
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.v;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Value v{};
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  void grow();
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

struct BpeOptions {
  bool byte_fallback = false;  // unknown chars -> <0xNN> tokens
  bool fuse_unk = false;       // consecutive unknowns -> one unk
  bool ignore_merges = false;  // a piece that is a whole vocab token is emitted as is
  std::string unk_token;       // empty: unknown chars without a fallback are dropped
};

class BpeModel {
 public:
  static constexpr size_t kMaxCachedPiece = 256;

  // vocab: token string -> id. Merges are added afterwards.
  BpeModel(StringIdMap vocab, BpeOptions opt);

  // Adds a merge of two vocab tokens (by string); the merged token must be in
  // the vocab. Rank = order of insertion unless given.
  void add_merge(std::string_view a, std::string_view b);
  // Adds a merge by ids with an explicit rank (tiktoken-style ranks).
  void add_merge_ids(int32_t a, int32_t b, int32_t rank, int32_t merged);

  // Prepares the byte-level tables (byte -> initial token, raw bytes -> id).
  // Call once after construction when the pre-tokenizer is byte-level.
  void enable_byte_level();

  // Appends the ids of one piece. byte_level: the piece is raw bytes (see
  // pretokenize.h); otherwise it is UTF-8 text split into characters.
  void encode(std::string_view piece, bool byte_level, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view tok) const;  // -1 when absent
  const StringIdMap& vocab() const { return vocab_; }
  const BpeOptions& options() const { return opt_; }
  size_t merge_count() const { return merges_.size(); }

 private:
  void initial_symbols(std::string_view piece, bool byte_level, std::vector<int32_t>& syms) const;
  void merge_symbols(std::vector<int32_t>& syms) const;
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_large(std::vector<int32_t>& syms) const;

  StringIdMap vocab_;
  BpeOptions opt_;
  MergeMap merges_;
  int32_t next_rank_ = 0;
  int32_t unk_id_ = -1;
  int32_t byte_fallback_id_[256];
  int32_t ascii_id_[128];        // id of each ASCII char as a token, -1 if absent
  std::vector<int32_t> bmp_id_;  // same for every BMP code point (char-level pieces)
  bool byte_level_ready_ = false;
  int32_t byte_id_[256];   // byte-level: byte -> id of its alphabet char
  StringIdMap raw_vocab_;  // byte-level: raw bytes of each token -> id

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace tandem::text
