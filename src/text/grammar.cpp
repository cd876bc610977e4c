#include "text/grammar.h"

#include <algorithm>
#include <numeric>

namespace tandem::text {

// ---- GrammarBuilder ----

int32_t GrammarBuilder::rule() {
  rules_.emplace_back();
  return int32_t(rules_.size() - 1);
}

void GrammarBuilder::alt(int32_t rule, const Seq& seq) {
  rules_[size_t(rule)].push_back(seq);
  size_ += seq.size() + 1;
}

GrammarBuilder::Sym GrammarBuilder::cls(const ByteClass& c) {
  std::string key(reinterpret_cast<const char*>(c.data()), sizeof(ByteClass));
  auto [it, inserted] = class_ids_.emplace(key, int32_t(classes_.size()));
  if (inserted) classes_.push_back(c);
  return {false, it->second};
}

GrammarBuilder::Sym GrammarBuilder::range(uint8_t lo, uint8_t hi) {
  ByteClass c{};
  for (int b = lo; b <= hi; ++b) c[size_t(b >> 6)] |= uint64_t(1) << (b & 63);
  return cls(c);
}

GrammarBuilder::Sym GrammarBuilder::byte(uint8_t b) {
  return range(b, b);
}

GrammarBuilder::Seq GrammarBuilder::lit(std::string_view s) {
  Seq seq;
  for (char c : s) seq.push_back(byte(uint8_t(c)));
  return seq;
}

int32_t GrammarBuilder::opt(const Seq& seq) {
  const int32_t r = rule();
  alt(r, seq);
  alt(r, {});
  return r;
}

int32_t GrammarBuilder::star(const Seq& seq) {
  const int32_t r = rule();
  Seq loop = seq;
  loop.push_back(ref(r));
  alt(r, loop);
  alt(r, {});
  return r;
}

size_t GrammarBuilder::size() const {
  return size_;
}

Grammar GrammarBuilder::build(int32_t root) {
  Grammar g;
  g.classes = classes_;
  g.root = root;
  g.rules.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r)
    for (const Seq& seq : rules_[r]) {
      g.rules[r].push_back(int32_t(g.elems.size()));
      for (const Sym& s : seq) g.elems.push_back({s.ref ? Grammar::Ref : Grammar::Chars, s.id});
      g.elems.push_back({Grammar::End, 0});
    }
  return g;
}

bool left_recursive(const Grammar& g) {
  const size_t n = g.rules.size();
  // Which rules can match the empty string (fixpoint).
  std::vector<uint8_t> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (int32_t p : g.rules[r]) {
        bool empty = true;
        for (int32_t q = p; g.elems[size_t(q)].kind != Grammar::End && empty; ++q)
          empty =
              g.elems[size_t(q)].kind == Grammar::Ref && nullable[size_t(g.elems[size_t(q)].arg)];
        if (empty) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  // Rules each rule may call before consuming anything; a cycle is left
  // recursion.
  std::vector<std::vector<int32_t>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (int32_t p : g.rules[r])
      for (int32_t q = p; g.elems[size_t(q)].kind == Grammar::Ref; ++q) {
        left[r].push_back(g.elems[size_t(q)].arg);
        if (!nullable[size_t(g.elems[size_t(q)].arg)]) break;
      }
  std::vector<uint8_t> state(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> stack;
  for (size_t s = 0; s < n; ++s) {
    if (state[s]) continue;
    stack.push_back({int32_t(s), 0});
    state[s] = 1;
    while (!stack.empty()) {
      auto& [r, k] = stack.back();
      if (k < left[size_t(r)].size()) {
        const int32_t next = left[size_t(r)][k++];
        if (state[size_t(next)] == 1) return true;
        if (state[size_t(next)] == 0) {
          state[size_t(next)] = 1;
          stack.push_back({next, 0});
        }
      } else {
        state[size_t(r)] = 2;
        stack.pop_back();
      }
    }
  }
  return false;
}

// ---- TokenTrie ----

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes,
                     const std::vector<uint8_t>& allowed) {
  vocab_ = int32_t(token_bytes.size());
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_; ++id)
    if (allowed[size_t(id)] && !token_bytes[size_t(id)].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return token_bytes[size_t(a)] < token_bytes[size_t(b)]; });
  // Sorted strings give the trie in preorder: each token adds the nodes past
  // its common prefix with the previous token.
  std::vector<int32_t> path;  // node index per depth
  std::string prev;
  std::vector<std::vector<int32_t>> tokens_at;
  for (int32_t id : order) {
    const std::string& s = token_bytes[size_t(id)];
    size_t common = 0;
    while (common < s.size() && common < prev.size() && common < path.size() &&
           s[common] == prev[common])
      ++common;
    path.resize(common);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(int32_t(byte_.size()));
      byte_.push_back(uint8_t(s[d]));
      depth_.push_back(int32_t(d + 1));
      tokens_at.emplace_back();
    }
    tokens_at[size_t(path.back())].push_back(id);
    max_depth_ = std::max(max_depth_, int32_t(s.size()));
    prev = s;
  }
  const int32_t n = int32_t(byte_.size());
  end_.assign(size_t(n), n);
  std::vector<int32_t> open;  // ancestors awaiting their end
  for (int32_t i = 0; i < n; ++i) {
    while (!open.empty() && depth_[size_t(open.back())] >= depth_[size_t(i)]) {
      end_[size_t(open.back())] = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  tok_begin_.push_back(0);
  for (auto& t : tokens_at) {
    ids_.insert(ids_.end(), t.begin(), t.end());
    tok_begin_.push_back(int32_t(ids_.size()));
  }
}

// ---- MaskCache ----

size_t MaskCache::Hash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 1469598103934665603ull;
  for (int32_t x : v) h = (h ^ uint32_t(x)) * 1099511628211ull;
  return size_t(h);
}

std::shared_ptr<const TokenMask> MaskCache::find(const std::vector<int32_t>& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  return it->second;
}

void MaskCache::put(const std::vector<int32_t>& key, std::shared_ptr<const TokenMask> mask) {
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.size() >= capacity_) map_.clear();
  map_[key] = std::move(mask);
}

// ---- GrammarMatcher ----

namespace {
constexpr int kMaxExpandDepth = 256;  // guards against a left-recursive grammar
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  bool acc = false;
  Grammar::Elem root{Grammar::Ref, g_->root};
  // Expand the root's alternatives with an empty stack below.
  for (int32_t start : g_->rules[size_t(root.arg)]) expand(start, -1, tops_, acc, 0);
  accepting_ = acc;
}

void GrammarMatcher::expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, bool& acc,
                            int depth) {
  if (depth > kMaxExpandDepth) return;
  const Grammar::Elem e = g_->elems[size_t(pos)];
  switch (e.kind) {
    case Grammar::Chars:
      for (int32_t t : out)
        if (nodes_[size_t(t)].pos == pos && nodes_[size_t(t)].parent == parent) return;
      nodes_.push_back({pos, parent});
      out.push_back(int32_t(nodes_.size() - 1));
      return;
    case Grammar::Ref: {
      int32_t ret = parent;
      if (g_->elems[size_t(pos) + 1].kind != Grammar::End) {  // not a tail call
        nodes_.push_back({pos + 1, parent});
        ret = int32_t(nodes_.size() - 1);
      }
      for (int32_t start : g_->rules[size_t(e.arg)]) expand(start, ret, out, acc, depth + 1);
      return;
    }
    case Grammar::End:
      if (parent < 0) {
        acc = true;
      } else {
        const Node p = nodes_[size_t(parent)];
        expand(p.pos, p.parent, out, acc, depth + 1);
      }
      return;
  }
}

void GrammarMatcher::advance(const std::vector<int32_t>& tops, uint8_t b, std::vector<int32_t>& out,
                             bool& acc) {
  out.clear();
  acc = false;
  for (int32_t t : tops) {
    const Node n = nodes_[size_t(t)];
    if (g_->has(g_->elems[size_t(n.pos)].arg, b)) expand(n.pos + 1, n.parent, out, acc, 0);
  }
}

bool GrammarMatcher::accept(std::string_view bytes) {
  const size_t mark = nodes_.size();
  std::vector<int32_t> cur = tops_, next;
  bool acc = accepting_;
  for (char c : bytes) {
    advance(cur, uint8_t(c), next, acc);
    if (next.empty() && !acc) {
      nodes_.resize(mark);
      return false;
    }
    cur.swap(next);
  }
  tops_ = std::move(cur);
  accepting_ = acc;
  compact();
  return true;
}

void GrammarMatcher::compact() {
  if (nodes_.size() < 4096) return;
  std::vector<int32_t> remap(nodes_.size(), -1);
  std::vector<Node> kept;
  // Copies a node and its parents, returning its new index.
  auto copy = [&](int32_t i, auto&& self) -> int32_t {
    if (i < 0) return -1;
    if (remap[size_t(i)] >= 0) return remap[size_t(i)];
    const int32_t parent = self(nodes_[size_t(i)].parent, self);
    kept.push_back({nodes_[size_t(i)].pos, parent});
    return remap[size_t(i)] = int32_t(kept.size() - 1);
  };
  for (int32_t& t : tops_) t = copy(t, copy);
  nodes_ = std::move(kept);
}

std::vector<int32_t> GrammarMatcher::state_key() const {
  std::vector<int32_t> key;
  std::vector<int32_t> sorted_tops;
  std::vector<std::vector<int32_t>> stacks;
  for (int32_t t : tops_) {
    std::vector<int32_t> s;
    for (int32_t i = t; i >= 0; i = nodes_[size_t(i)].parent) s.push_back(nodes_[size_t(i)].pos);
    stacks.push_back(std::move(s));
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  for (auto& s : stacks) {
    key.insert(key.end(), s.begin(), s.end());
    key.push_back(-1);
  }
  key.push_back(accepting_ ? 1 : 0);
  return key;
}

std::shared_ptr<const TokenMask> GrammarMatcher::mask(const TokenTrie& trie, MaskCache* cache) {
  std::vector<int32_t> key;
  if (cache) {
    key = state_key();
    if (auto m = cache->find(key)) return m;
  }
  auto m = std::make_shared<TokenMask>();
  m->bits.assign(size_t(trie.vocab_ + 63) / 64, 0);
  m->can_end = accepting_;
  const size_t base = nodes_.size();
  const int32_t depth_max = trie.max_depth_;
  std::vector<std::vector<int32_t>> level(size_t(depth_max) + 1);
  std::vector<size_t> mark(size_t(depth_max) + 1, base);
  level[0] = tops_;
  const int32_t n = int32_t(trie.byte_.size());
  int32_t i = 0;
  while (i < n) {
    const int32_t d = trie.depth_[size_t(i)];
    nodes_.resize(mark[size_t(d - 1)]);
    bool acc = false;
    advance(level[size_t(d - 1)], trie.byte_[size_t(i)], level[size_t(d)], acc);
    if (level[size_t(d)].empty() && !acc) {
      i = trie.end_[size_t(i)];
      continue;
    }
    for (int32_t k = trie.tok_begin_[size_t(i)]; k < trie.tok_begin_[size_t(i) + 1]; ++k) {
      const int32_t id = trie.ids_[size_t(k)];
      m->bits[size_t(id >> 6)] |= uint64_t(1) << (id & 63);
      m->any_token = true;
    }
    if (level[size_t(d)].empty()) {
      i = trie.end_[size_t(i)];
      continue;
    }
    mark[size_t(d)] = nodes_.size();
    ++i;
  }
  nodes_.resize(base);
  std::shared_ptr<const TokenMask> out = std::move(m);
  if (cache) cache->put(key, out);
  return out;
}

}  // namespace tandem::text
