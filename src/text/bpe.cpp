// BPE model; see bpe.h.
#include "text/bpe.h"

#include <climits>
#include <queue>

#include "core/error.h"
#include "text/unicode.h"

namespace tandem::text {

void MergeMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty)
      insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key), s.v);
}

void MergeMap::grow() {
  reserve(slots_.empty() ? 16 : slots_.size());
}

void MergeMap::insert(int32_t a, int32_t b, Value v) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  uint64_t k = key(a, b);
  for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == k) return;  // keep the first (lowest rank)
    if (s.key == kEmpty) {
      s.key = k;
      s.v = v;
      ++size_;
      return;
    }
  }
}

BpeModel::BpeModel(StringIdMap vocab, BpeOptions opt)
    : vocab_(std::move(vocab)), opt_(std::move(opt)) {
  if (!opt_.unk_token.empty()) unk_id_ = token_to_id(opt_.unk_token);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_fallback_id_[b] = token_to_id(name);
    byte_id_[b] = -1;
  }
  for (int c = 0; c < 128; ++c) {
    char s[1] = {static_cast<char>(c)};
    ascii_id_[c] = token_to_id(std::string_view(s, 1));
  }
  // Single-code-point tokens of the BMP, for a lookup without hashing.
  bmp_id_.assign(0x10000, -1);
  for (const auto& [tok, id] : vocab_) {
    char32_t cp;
    if (tok.size() <= 3 && decode_utf8(tok, 0, &cp) == static_cast<int>(tok.size()) && cp < 0x10000)
      bmp_id_[cp] = id;
  }
}

int32_t BpeModel::token_to_id(std::string_view tok) const {
  auto it = vocab_.find(tok);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::add_merge(std::string_view a, std::string_view b) {
  int32_t ia = token_to_id(a), ib = token_to_id(b);
  std::string ab;
  ab.reserve(a.size() + b.size());
  ab.append(a);
  ab.append(b);
  int32_t im = token_to_id(ab);
  if (ia < 0 || ib < 0 || im < 0)
    fail("tokenizer.json: merge #%d (\"%.*s\" \"%.*s\") uses a token missing from the vocab",
         next_rank_, static_cast<int>(a.size()), a.data(), static_cast<int>(b.size()), b.data());
  merges_.insert(ia, ib, {next_rank_++, im});
}

void BpeModel::add_merge_ids(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  merges_.insert(a, b, {rank, merged});
}

void BpeModel::enable_byte_level() {
  if (byte_level_ready_) return;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(static_cast<uint8_t>(b)));
    byte_id_[b] = token_to_id(s);
  }
  if (opt_.ignore_merges) {
    raw_vocab_.reserve(vocab_.size());
    for (const auto& [tok, id] : vocab_) {
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < tok.size() && ok;) {
        char32_t cp;
        int n = decode_utf8(tok, i, &cp);
        int byte = n ? unicode_to_byte(cp) : -1;
        if (byte < 0) ok = false;
        raw += static_cast<char>(byte);
        i += n ? n : 1;
      }
      if (ok) raw_vocab_.emplace(std::move(raw), id);
    }
  }
  byte_level_ready_ = true;
}

void BpeModel::initial_symbols(std::string_view piece, bool byte_level,
                               std::vector<int32_t>& syms) const {
  bool last_unk = false;
  auto unknown = [&](std::string_view ch) {
    if (opt_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_fallback_id_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) syms.push_back(byte_fallback_id_[b]);
        last_unk = false;
        return;
      }
    }
    if (unk_id_ < 0) return;  // no unk token: the character is dropped
    if (!(opt_.fuse_unk && last_unk)) syms.push_back(unk_id_);
    last_unk = true;
  };
  if (byte_level) {
    for (unsigned char b : piece) {
      int32_t id = byte_id_[b];
      if (id >= 0) {
        syms.push_back(id);
        last_unk = false;
      } else {
        std::string mapped;  // the byte's alphabet char, as `tokenizers` would see it
        append_utf8(mapped, byte_to_unicode(b));
        unknown(mapped);
      }
    }
    return;
  }
  for (size_t i = 0; i < piece.size();) {
    unsigned char lead = static_cast<unsigned char>(piece[i]);
    size_t n = std::min<size_t>(utf8_len(lead), piece.size() - i);
    int32_t id;
    char32_t cp;
    if (lead < 0x80)
      id = ascii_id_[lead];
    else if (n <= 3 && decode_utf8(piece, i, &cp) == static_cast<int>(n))
      id = bmp_id_[cp];
    else
      id = token_to_id(piece.substr(i, n));
    if (id >= 0) {
      syms.push_back(id);
      last_unk = false;
    } else {
      unknown(piece.substr(i, n));
    }
    i += n;
  }
}

void BpeModel::merge_small(std::vector<int32_t>& s) const {
  // rank[i] / merged[i] describe the pair (s[i], s[i+1]).
  int32_t rank[64], merged[64];
  size_t n = s.size();
  auto look = [&](size_t i) {
    const MergeMap::Value* v = merges_.find(s[i], s[i + 1]);
    rank[i] = v ? v->rank : INT_MAX;
    merged[i] = v ? v->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT_MAX) break;
    s[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
  s.resize(n);
}

void BpeModel::merge_large(std::vector<int32_t>& s) const {
  struct Sym {
    int32_t id, prev, next;
  };
  struct Cand {
    int32_t rank, pos, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(s.size());
  std::vector<Sym> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {s[i], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> pq;
  auto push = [&](int32_t pos) {
    int32_t nx = sym[pos].next;
    if (nx < 0) return;
    if (const MergeMap::Value* v = merges_.find(sym[pos].id, sym[nx].id))
      pq.push({v->rank, pos, v->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!pq.empty()) {
    Cand c = pq.top();
    pq.pop();
    Sym& l = sym[c.pos];
    if (l.id < 0 || l.next < 0) continue;
    const MergeMap::Value* v = merges_.find(l.id, sym[l.next].id);
    if (!v || v->id != c.merged) continue;  // stale: the pair has changed
    int32_t r = l.next;
    l.id = c.merged;
    l.next = sym[r].next;
    if (l.next >= 0) sym[l.next].prev = c.pos;
    sym[r].id = -1;
    if (l.prev >= 0) push(l.prev);
    push(c.pos);
  }
  s.clear();
  for (int32_t i = 0; i >= 0 && i < n; i = sym[i].next) s.push_back(sym[i].id);
}

void BpeModel::merge_symbols(std::vector<int32_t>& s) const {
  if (s.size() < 2) return;
  if (s.size() <= 48)
    merge_small(s);
  else
    merge_large(s);
}

void BpeModel::encode(std::string_view piece, bool byte_level, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> syms;
  int32_t whole = -1;
  if (opt_.ignore_merges) {
    if (byte_level) {
      auto it = raw_vocab_.find(piece);
      if (it != raw_vocab_.end()) whole = it->second;
    } else {
      whole = token_to_id(piece);
    }
  }
  if (whole >= 0) {
    syms.push_back(whole);
  } else {
    syms.reserve(piece.size());
    initial_symbols(piece, byte_level, syms);
    merge_symbols(syms);
  }
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= (1u << 16)) cache_.clear();
    cache_.emplace(std::string(piece), std::move(syms));
  }
}

}  // namespace tandem::text
