#include "model/kv_pool.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/hash.h"

namespace tandem {

namespace {

int64_t blocks_for(int64_t positions) {
  return (positions + KvPool::kBlockSize - 1) / KvPool::kBlockSize;
}

}  // namespace

KvPool::KvPool(const ModelSpec& spec, int64_t full_blocks, int64_t sliding_blocks,
               bool host_storage, DType row_dtype)
    : host_storage_(host_storage), row_dtype_(row_dtype) {
  if (row_dtype != DType::F32 && row_dtype != DType::BF16)
    fail("kv pool: rows of %s are not supported (--kv-cache-dtype takes f32 or bf16)",
         std::string(dtype_name(row_dtype)).c_str());
  if (host_storage && row_dtype != DType::F32)
    fail("kv pool: the CPU decoder keeps f32 KV rows (--kv-cache-dtype %s needs --device cuda)",
         row_dtype == DType::BF16 ? "bf16" : "?");
  const int64_t counts[2] = {spec.has_kind(AttentionKind::Full) ? full_blocks : 0,
                             spec.has_kind(AttentionKind::Sliding) ? sliding_blocks : 0};
  for (int k = 0; k < 2; ++k) {
    if (counts[k] < 0 || counts[k] > INT32_MAX)
      fail("kv pool: invalid block count %lld", (long long)counts[k]);
    Kind& kind = kinds_[k];
    kind.total = size_t(counts[k]);
    kind.holds.assign(kind.total, 0);
    kind.keys.resize(kind.total);
    kind.published.assign(kind.total, 0);
    kind.cached_at.resize(kind.total);
    kind.free.resize(kind.total);
    // LIFO: hand out low ids first.
    for (int64_t i = 0; i < counts[k]; ++i) kind.free[size_t(i)] = int32_t(counts[k] - 1 - i);
  }
  layers_.resize(size_t(spec.layers));
  for (int64_t l = 0; l < spec.layers; ++l) {
    const LayerSpec& ls = spec.layer[size_t(l)];
    Layer& layer = layers_[size_t(l)];
    layer.source = ls.kv_source;
    layer.kv_dim = ls.kv_dim();
    if (ls.kv_source != l || !host_storage) continue;  // reads its source's rows
    const size_t n = kinds_[int(ls.kind)].total * size_t(kBlockSize * layer.kv_dim);
    layer.k.assign(n, 0.0f);
    layer.v.assign(n, 0.0f);
  }
}

int64_t KvPool::sliding_blocks_per_sequence(const ModelSpec& spec, int64_t max_step_tokens) {
  // Keys [first query - W + 1, last query] span W + step - 1 positions, which
  // can straddle one more block boundary than their length needs.
  return blocks_for(spec.sliding_window + max_step_tokens - 1) + 1;
}

size_t KvPool::block_bytes(const ModelSpec& spec, AttentionKind kind, DType row_dtype) {
  size_t bytes = 0;
  for (int64_t l = 0; l < spec.layers; ++l) {
    const LayerSpec& ls = spec.layer[size_t(l)];
    if (ls.kind == kind && ls.kv_source == l)
      bytes += 2 * size_t(kBlockSize * ls.kv_dim()) * dtype_size(row_dtype);
  }
  return bytes;
}

int32_t KvPool::allocate(AttentionKind kind) {
  Kind& k = kinds_[int(kind)];
  int32_t b = -1;
  if (!k.free.empty()) {
    b = k.free.back();
    k.free.pop_back();
  } else if (!k.cached.empty()) {  // evict the least recently released
    b = k.cached.front();
    k.cached.pop_front();
    k.by_hash.erase(k.keys[size_t(b)].hash);
    k.published[size_t(b)] = 0;
  } else {
    return -1;
  }
  k.holds[size_t(b)] = 1;
  return b;
}

void KvPool::release(AttentionKind kind, int32_t block) {
  Kind& k = kinds_[int(kind)];
  const size_t b = size_t(block);
  if (block < 0 || b >= k.total || k.holds[b] <= 0)
    fail("kv pool: block %d released but not held (an engine bug)", block);
  if (--k.holds[b] > 0) return;
  if (k.published[b])
    k.cached_at[b] = k.cached.insert(k.cached.end(), block);
  else
    k.free.push_back(block);
}

int32_t KvPool::lookup(AttentionKind kind, const BlockKey& key) const {
  const Kind& k = kinds_[int(kind)];
  auto it = k.by_hash.find(key.hash);
  return it != k.by_hash.end() && k.keys[size_t(it->second)] == key ? it->second : -1;
}

void KvPool::acquire(AttentionKind kind, int32_t block) {
  Kind& k = kinds_[int(kind)];
  const size_t b = size_t(block);
  if (block < 0 || b >= k.total || (k.holds[b] == 0 && !k.published[b]))
    fail("kv pool: block %d acquired but neither held nor cached (an engine bug)", block);
  if (k.holds[b]++ == 0) k.cached.erase(k.cached_at[b]);
}

void KvPool::publish(AttentionKind kind, int32_t block, const BlockKey& key) {
  Kind& k = kinds_[int(kind)];
  const size_t b = size_t(block);
  if (k.published[b] || k.by_hash.count(key.hash)) return;
  k.keys[b] = key;
  k.published[b] = 1;
  k.by_hash.emplace(key.hash, block);
}

void KvPool::drop_cached() {
  for (Kind& k : kinds_) {
    for (int32_t b : k.cached) {
      k.by_hash.erase(k.keys[size_t(b)].hash);
      k.published[size_t(b)] = 0;
      k.free.push_back(b);
    }
    k.cached.clear();
  }
}

BlockKey block_key(uint64_t parent, const int32_t* tokens, uint64_t salt) {
  // Each token folded into the running hash through mix64: a well-mixed
  // 64-bit chain (lookup() also compares the tokens and parent).
  BlockKey key;
  key.parent = parent;
  key.salt = salt;
  uint64_t h = mix64(mix64(parent + 0x9e3779b97f4a7c15ull) ^ salt);
  for (int64_t i = 0; i < BlockKey::kTokens; ++i) {
    key.tokens[size_t(i)] = tokens[i];
    h = mix64(h ^ (uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull * uint64_t(i + 1)));
  }
  key.hash = h;
  return key;
}

size_t KvPool::bytes() const {
  size_t n = 0;
  for (const Layer& l : layers_) n += (l.k.size() + l.v.size()) * sizeof(float);
  return n;
}

bool kv_reserve(KvPool& pool, const ModelSpec& spec, SequenceKv& seq, int64_t new_length) {
  const int64_t want = blocks_for(new_length);
  const bool has_full = spec.has_kind(AttentionKind::Full);
  const bool has_sliding = spec.has_kind(AttentionKind::Sliding);
  const int64_t need_full = has_full ? std::max<int64_t>(0, want - int64_t(seq.full.size())) : 0;
  const int64_t need_sliding =
      has_sliding ? std::max<int64_t>(0, want - seq.sliding_first - int64_t(seq.sliding.size()))
                  : 0;
  if (need_full > pool.free_count(AttentionKind::Full) ||
      need_sliding > pool.free_count(AttentionKind::Sliding))
    return false;
  for (int64_t i = 0; i < need_full; ++i) seq.full.push_back(pool.allocate(AttentionKind::Full));
  for (int64_t i = 0; i < need_sliding; ++i)
    seq.sliding.push_back(pool.allocate(AttentionKind::Sliding));
  return true;
}

namespace {

// The first block a sliding layer still needs at length `length`: the next
// query (position `length`) sees keys from length - W + 1.
int64_t first_sliding_block(const ModelSpec& spec, int64_t length) {
  return std::max<int64_t>(0, length - spec.sliding_window + 1) / KvPool::kBlockSize;
}

}  // namespace

void kv_trim_sliding(KvPool& pool, const ModelSpec& spec, SequenceKv& seq) {
  if (spec.sliding_window <= 0 || seq.sliding.empty()) return;
  const int64_t first_block = first_sliding_block(spec, seq.length);
  int64_t drop = std::min<int64_t>(first_block - seq.sliding_first, int64_t(seq.sliding.size()));
  for (int64_t i = 0; i < drop; ++i) pool.release(AttentionKind::Sliding, seq.sliding[size_t(i)]);
  if (drop > 0) {
    seq.sliding.erase(seq.sliding.begin(), seq.sliding.begin() + drop);
    seq.sliding_first += drop;
  }
}

void kv_release(KvPool& pool, SequenceKv& seq) {
  for (int32_t b : seq.full) pool.release(AttentionKind::Full, b);
  for (int32_t b : seq.sliding) pool.release(AttentionKind::Sliding, b);
  seq = SequenceKv{};
}

namespace {

// The longest prefix kv_take_prefix may take: its blocks, with their keys and the cached full and
// sliding blocks (from block `first_sliding` on) that hold it.
struct PrefixMatch {
  std::vector<BlockKey> keys;
  std::vector<int32_t> full, sliding;
  int64_t blocks = 0, first_sliding = 0;
};

PrefixMatch match_prefix(const KvPool& pool, const ModelSpec& spec, const PrefixTokens& q) {
  constexpr int64_t B = KvPool::kBlockSize;
  const std::vector<int32_t>& tokens = q.tokens;
  PrefixMatch m;
  if (tokens.empty()) return m;
  const bool has_full = spec.has_kind(AttentionKind::Full);
  const bool has_sliding = spec.has_kind(AttentionKind::Sliding);
  // Whole blocks before the last token, as far as the full layers' are cached.
  const int64_t most = (int64_t(tokens.size()) - 1) / B;
  for (int64_t i = 0; i < most; ++i) {
    const BlockKey key = block_key(i ? m.keys.back().hash : 0, tokens.data() + i * B, q.salt(i));
    if (has_full) {
      const int32_t b = pool.lookup(AttentionKind::Full, key);
      if (b < 0) break;
      m.full.push_back(b);
    }
    m.keys.push_back(key);
  }
  // The longest of those whose visible sliding blocks are cached. It may end
  // inside a bidirectional image run: a published block's rows were computed
  // in a step that held the whole run (prefill never splits one), and the
  // salt ties them to the image's pixels, so they are what this prompt would
  // compute; the rest of the run then comes as one chunk
  // (chunk_outside_runs), attending to the cached part.
  for (m.blocks = int64_t(m.keys.size()); m.blocks > 0; --m.blocks) {
    const int64_t end = m.blocks * B;  // < tokens.size()
    if (!has_sliding) break;
    m.first_sliding = first_sliding_block(spec, end);
    m.sliding.clear();
    for (int64_t i = m.first_sliding; i < m.blocks; ++i) {
      const int32_t b = pool.lookup(AttentionKind::Sliding, m.keys[size_t(i)]);
      if (b < 0) break;
      m.sliding.push_back(b);
    }
    if (int64_t(m.sliding.size()) == m.blocks - m.first_sliding) break;
  }
  if (m.blocks == 0) {
    m.sliding.clear();
    m.first_sliding = 0;
  }
  if (has_full) m.full.resize(size_t(m.blocks));
  return m;
}

}  // namespace

int64_t kv_cached_prefix(const KvPool& pool, const ModelSpec& spec, const PrefixTokens& q) {
  return match_prefix(pool, spec, q).blocks * KvPool::kBlockSize;
}

int64_t kv_take_prefix(KvPool& pool, const ModelSpec& spec, SequenceKv& seq,
                       const PrefixTokens& q) {
  if (seq.length != 0 || !seq.full.empty() || !seq.sliding.empty()) return 0;
  PrefixMatch m = match_prefix(pool, spec, q);
  if (m.blocks == 0) return 0;
  for (int32_t b : m.full) pool.acquire(AttentionKind::Full, b);
  for (int32_t b : m.sliding) pool.acquire(AttentionKind::Sliding, b);
  seq.full = std::move(m.full);
  seq.sliding = std::move(m.sliding);
  seq.sliding_first = m.first_sliding;
  seq.length = m.blocks * KvPool::kBlockSize;
  for (int64_t i = 0; i < m.blocks; ++i) seq.hashes.push_back(m.keys[size_t(i)].hash);
  return seq.length;
}

void kv_publish(KvPool& pool, const ModelSpec& spec, SequenceKv& seq, const PrefixTokens& q) {
  constexpr int64_t B = KvPool::kBlockSize;
  const int64_t full_blocks = std::min<int64_t>(seq.length, int64_t(q.tokens.size())) / B;
  const bool has_full = spec.has_kind(AttentionKind::Full);
  for (int64_t i = int64_t(seq.hashes.size()); i < full_blocks; ++i) {
    const BlockKey key = block_key(i ? seq.hashes.back() : 0, q.tokens.data() + i * B, q.salt(i));
    seq.hashes.push_back(key.hash);
    if (has_full) pool.publish(AttentionKind::Full, seq.full[size_t(i)], key);
    if (i >= seq.sliding_first && i - seq.sliding_first < int64_t(seq.sliding.size()))
      pool.publish(AttentionKind::Sliding, seq.sliding[size_t(i - seq.sliding_first)], key);
  }
}

}  // namespace tandem
