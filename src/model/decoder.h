// The one decoder: a pre-norm transformer whose family differences are
// ModelSpec flags. CPU backend; one sequence at a time (the batched engine
// comes with the server).
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "model/rope.h"

namespace tandem {

class Decoder {
 public:
  // Prefill is processed in chunks of at most `max_chunk` tokens; a KvCache
  // used with this decoder must be built with the same max_chunk.
  static constexpr int64_t kDefaultMaxChunk = 256;

  Decoder(const Model& model, ThreadPool& pool, int64_t max_chunk = kDefaultMaxChunk);

  const ModelSpec& spec() const { return model_.spec; }
  int64_t max_chunk() const { return max_chunk_; }
  KvCache new_cache(int64_t capacity) const { return KvCache(model_.spec, capacity, max_chunk_); }

  // Appends n tokens at positions cache.length .. cache.length+n-1 and writes
  // logits: [n, V] when all_logits, else [V] for the last token only.
  // Throws Error for an id outside [0, V) or when the cache would overflow.
  void forward(const int32_t* ids, int64_t n, KvCache& cache, float* logits, bool all_logits);

 private:
  void forward_chunk(const int32_t* ids, int64_t n, KvCache& cache, float* logits, bool all_logits);
  void attention_block(int64_t layer, int64_t n, KvCache& cache);
  void mlp_block(int64_t layer, int64_t n);

  const Model& model_;
  ThreadPool& pool_;
  int64_t max_chunk_;
  RopeTable rope_full_, rope_sliding_;
  // Scratch, sized for max_chunk tokens.
  std::vector<float> h_;     // [T, D] residual stream
  std::vector<float> x_;     // [T, D] normed input of a block
  std::vector<float> q_;     // [T, H·Dh]
  std::vector<float> k_;     // [T, K·Dh]
  std::vector<float> v_;     // [T, K·Dh]
  std::vector<float> attn_;  // [T, H·Dh]
  std::vector<float> out_;   // [T, D]
  std::vector<float> gate_;  // [T, F]
  std::vector<float> up_;    // [T, F]
};

}  // namespace tandem
