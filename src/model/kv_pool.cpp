#include "model/kv_pool.h"

#include <algorithm>
#include <string>

#include "core/error.h"

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
    kinds_[k].total = size_t(counts[k]);
    kinds_[k].free.resize(size_t(counts[k]));
    // LIFO: hand out low ids first.
    for (int64_t i = 0; i < counts[k]; ++i) kinds_[k].free[size_t(i)] = int32_t(counts[k] - 1 - i);
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
  auto& free = kinds_[int(kind)].free;
  if (free.empty()) return -1;
  int32_t b = free.back();
  free.pop_back();
  return b;
}

void KvPool::release(AttentionKind kind, int32_t block) {
  kinds_[int(kind)].free.push_back(block);
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

void kv_trim_sliding(KvPool& pool, const ModelSpec& spec, SequenceKv& seq) {
  if (spec.sliding_window <= 0 || seq.sliding.empty()) return;
  // The next query (position seq.length) sees keys from seq.length - W + 1.
  const int64_t first_visible = std::max<int64_t>(0, seq.length - spec.sliding_window + 1);
  const int64_t first_block = first_visible / KvPool::kBlockSize;
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

}  // namespace tandem
