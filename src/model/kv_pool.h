// Paged KV cache: fixed-size blocks from a pool, shared by all sequences.
//
// Each attention kind (full, sliding) has its own block pool: full layers
// keep every position of a sequence, sliding layers only the blocks that a
// future query can still see. A block holds kBlockSize positions of K and V
// for every layer of its kind that computes its own (KV-shared layers read
// their source layer's rows). A sequence's SequenceKv maps its positions to
// blocks (a block table per kind).
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "model/model.h"

namespace tandem {

// What a full block holds, for the prefix cache: its tokens, a hash of the
// images whose soft tokens it holds (`salt`, 0: none), and the chain hash of
// everything before them (`parent`); `hash` chains the three. KV rows depend
// on the tokens (and images) up to their position only (causal attention;
// an image's bidirectional run is all one image), so two sequences whose
// first (i + 1)·kBlockSize tokens and images agree have the same rows in
// block i.
struct BlockKey {
  static constexpr int64_t kTokens = 16;  // KvPool::kBlockSize
  uint64_t parent = 0, salt = 0, hash = 0;
  std::array<int32_t, kTokens> tokens{};
  bool operator==(const BlockKey& o) const {
    return parent == o.parent && salt == o.salt && tokens == o.tokens;
  }
};
// The key of the block holding `tokens` (kBlockSize ids) and `salt` after
// `parent` (0 for the first block).
BlockKey block_key(uint64_t parent, const int32_t* tokens, uint64_t salt = 0);

// A sequence's tokens as the prefix cache sees them.
struct PrefixTokens {
  const std::vector<int32_t>& tokens;
  // Per block: the salt of its images (image_block_salts); absent or past
  // its end: 0.
  const std::vector<uint64_t>* salts = nullptr;
  uint64_t salt(int64_t block) const {
    return salts && block < int64_t(salts->size()) ? (*salts)[size_t(block)] : 0;
  }
};

class KvPool {
 public:
  static constexpr int64_t kBlockSize = 16;
  static_assert(BlockKey::kTokens == kBlockSize);

  // `blocks[k]` blocks for attention kind k (indexed by AttentionKind). With
  // `host_storage` false the pool hands out block ids only: a GPU runner
  // keeps the rows in device memory under the same ids and layout, as
  // `row_dtype` values (F32, or BF16: half the bytes, what vLLM and
  // llama.cpp keep by default). Host rows are F32 only (the CPU decoder's);
  // any other pairing is an Error naming --kv-cache-dtype.
  KvPool(const ModelSpec& spec, int64_t full_blocks, int64_t sliding_blocks,
         bool host_storage = true, DType row_dtype = DType::F32);
  bool has_host_storage() const { return host_storage_; }
  DType row_dtype() const { return row_dtype_; }

  // Sliding blocks one sequence can hold at once when steps add at most
  // `max_step_tokens` tokens: the window, the step, and block rounding.
  static int64_t sliding_blocks_per_sequence(const ModelSpec& spec, int64_t max_step_tokens);
  // Bytes of one block of a kind (all layers of that kind, K and V) with
  // rows of `row_dtype`.
  static size_t block_bytes(const ModelSpec& spec, AttentionKind kind,
                            DType row_dtype = DType::F32);

  int64_t total(AttentionKind kind) const { return int64_t(kinds_[int(kind)].total); }
  // Blocks allocate() can hand out: never-published ones and cached ones
  // (published, held by no sequence), which it evicts.
  int64_t free_count(AttentionKind kind) const {
    const Kind& k = kinds_[int(kind)];
    return int64_t(k.free.size() + k.cached.size());
  }
  // Of those, the cached ones (their rows still reusable).
  int64_t cached_count(AttentionKind kind) const {
    return int64_t(kinds_[int(kind)].cached.size());
  }
  // A block id held once, or -1 when the kind's pool is empty. Takes a
  // never-published block first, else evicts the least recently released
  // cached one.
  int32_t allocate(AttentionKind kind);
  // Drops one hold; a block nobody holds is free again, or cached when it
  // was published.
  void release(AttentionKind kind, int32_t block);

  // The prefix cache. A full block (every position written) can be
  // published under its BlockKey; it then outlives its sequence until its
  // memory is needed, and lookup() finds it for any sequence whose tokens
  // agree. Shared blocks are full, so nobody writes them again.
  // The published block of `key`, or -1.
  int32_t lookup(AttentionKind kind, const BlockKey& key) const;
  // One more hold on a held or cached block (from lookup()).
  void acquire(AttentionKind kind, int32_t block);
  // Publishes a held block under `key`, unless it or another block already
  // holds that key (two sequences computed the same rows: the first stays).
  void publish(AttentionKind kind, int32_t block, const BlockKey& key);
  // Evicts every cached block (the engine's cache-drop fault, for tests).
  void drop_cached();
  // Bytes of host storage (0 without it).
  size_t bytes() const;

  // K / V rows of `block` for `layer` (its source layer's storage when it is
  // KV-shared): [kBlockSize, K·Dh] f32.
  float* keys(int64_t layer, int32_t block) {
    return source(layer).k.data() + offset(layer, block);
  }
  float* values(int64_t layer, int32_t block) {
    return source(layer).v.data() + offset(layer, block);
  }
  const float* keys(int64_t layer) { return source(layer).k.data(); }
  const float* values(int64_t layer) { return source(layer).v.data(); }

 private:
  struct Layer {
    int64_t source = 0;       // layer whose storage this one reads
    int64_t kv_dim = 0;       // K·Dh
    std::vector<float> k, v;  // [blocks of kind, kBlockSize, K·Dh]; empty when shared
  };
  Layer& source(int64_t layer) { return layers_[size_t(layers_[size_t(layer)].source)]; }
  size_t offset(int64_t layer, int32_t block) const {
    return size_t(block) * size_t(kBlockSize * layers_[size_t(layer)].kv_dim);
  }

  struct Kind {
    size_t total = 0;
    std::vector<int32_t> free;   // LIFO list of unpublished blocks nobody holds
    std::vector<int32_t> holds;  // per block: sequences holding it
    std::vector<BlockKey> keys;  // per block: its key when published
    std::vector<char> published;
    std::unordered_map<uint64_t, int32_t> by_hash;  // published blocks
    std::list<int32_t> cached;  // published blocks nobody holds, least recently released first
    std::vector<std::list<int32_t>::iterator> cached_at;  // per block, valid while cached
  };
  Kind kinds_[2];
  std::vector<Layer> layers_;
  bool host_storage_ = true;
  DType row_dtype_ = DType::F32;
};

// Where one sequence's keys and values live.
struct SequenceKv {
  int64_t length = 0;            // positions written
  std::vector<uint64_t> hashes;  // BlockKey::hash of blocks 0.. (published or taken from the cache)
  std::vector<int32_t> full;     // full[i] holds positions [i·B, (i+1)·B)
  std::vector<int32_t> sliding;  // sliding[i] holds positions [(sliding_first + i)·B, ...)
  int64_t sliding_first = 0;     // block index (in positions / B) of sliding[0]

  // The block holding `pos` for a layer of `kind`.
  int32_t block_of(AttentionKind kind, int64_t pos) const {
    const int64_t b = pos / KvPool::kBlockSize;
    return kind == AttentionKind::Full ? full[size_t(b)] : sliding[size_t(b - sliding_first)];
  }
};

// Makes room for positions [seq.length, new_length). All or nothing: returns
// false and changes nothing when a pool lacks blocks.
bool kv_reserve(KvPool& pool, const ModelSpec& spec, SequenceKv& seq, int64_t new_length);
// Releases sliding blocks that no query at position >= seq.length can see.
void kv_trim_sliding(KvPool& pool, const ModelSpec& spec, SequenceKv& seq);
// Returns every block of the sequence to the pool and resets it.
void kv_release(KvPool& pool, SequenceKv& seq);

// The prefix cache, for an empty `seq` about to compute `tokens`: takes the
// cached blocks of the longest prefix of whole blocks that leaves at least
// one token to compute (the last token's logits are needed) and whose
// sliding blocks, if the model has sliding
// layers, are cached too. Returns the positions taken (seq.length).
int64_t kv_take_prefix(KvPool& pool, const ModelSpec& spec, SequenceKv& seq,
                       const PrefixTokens& tokens);
// The positions kv_take_prefix would take now, taking nothing.
int64_t kv_cached_prefix(const KvPool& pool, const ModelSpec& spec, const PrefixTokens& tokens);
// Publishes the sequence's full blocks not yet published (`tokens`: the
// sequence's, at least seq.length of them).
void kv_publish(KvPool& pool, const ModelSpec& spec, SequenceKv& seq, const PrefixTokens& tokens);

}  // namespace tandem
