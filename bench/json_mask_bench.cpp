// json_mask_bench: the per-step cost of structured outputs' token masks
// (text/grammar.h) on real vocabularies.
//
// Usage: json_mask_bench [TOKENIZER_DIR ...]
//   (default: ~/.cache/tandem/tokenizers/{gemma3,qwen3,llama3_1})
//
// For each tokenizer: the one-time vocabulary build (token bytes + trie),
// then a decode replayed token by token over a sample document of a schema
// (the document tokenized by the tokenizer; each step computes the mask of
// the current state, then accepts the document's next token):
//  - uncached: every mask computed by the trie walk;
//  - cold cache: one shared MaskCache, first pass (states repeat inside
//    strings and between items);
//  - warm cache: the same document again (a repeated schema).
// Plus the cost of applying a mask to a row of logits as the engine does.
// Single-threaded, wall time, best of 3 passes for the per-step figures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "text/grammar.h"
#include "text/json_schema_grammar.h"
#include "text/token_bytes.h"
#include "text/tokenizer.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Case {
  const char* name;
  const char* schema;  // nullptr: json_object
  const char* doc;
};

const Case kCases[] = {
    {"person schema",
     R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string"}},"required":["city","zip"]}},"required":["name","age","email","tags","address"],"additionalProperties":false})",
     R"({"name": "Ada Lovelace", "age": 36, "email": "ada.lovelace@example.com", "tags": ["mathematics", "poetry", "analytical engine"], "address": {"city": "London", "zip": "W1J 7NT"}})"},
    {"json_object", nullptr,
     R"({"title": "Notes on the Analytical Engine", "year": 1843, "pages": [1, 2, 3, 5, 8], "translator": {"name": "Ada", "notes": ["A", "B", "C", "D", "E", "F", "G"]}, "summary": "The engine might act upon other things besides number, were objects found whose mutual fundamental relations could be expressed by those of the abstract science of operations."})"},
};

struct Stats {
  double mean = 0, p50 = 0, max = 0;
  int steps = 0;
};

Stats replay(const std::shared_ptr<const text::Grammar>& g, const text::TokenVocab& v,
             const std::vector<int32_t>& ids, text::MaskCache* cache) {
  text::GrammarMatcher m(g);
  std::vector<double> t;
  for (int32_t id : ids) {
    const auto t0 = Clock::now();
    auto mask = m.mask(v.trie, cache);
    t.push_back(ms_since(t0));
    if (!mask->allows(id) || !m.accept(v.tokens.bytes[size_t(id)])) {
      std::fprintf(stderr, "  (token %d not allowed; replay stopped after %zu steps)\n", id,
                   t.size());
      break;
    }
  }
  Stats s;
  s.steps = int(t.size());
  if (t.empty()) return s;
  for (double x : t) s.mean += x / double(t.size());
  std::vector<double> sorted = t;
  std::sort(sorted.begin(), sorted.end());
  s.p50 = sorted[sorted.size() / 2];
  s.max = sorted.back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) dirs.push_back(argv[i]);
  if (dirs.empty()) {
    const char* home = std::getenv("HOME");
    for (const char* n : {"gemma3", "qwen3", "llama3_1"})
      dirs.push_back(std::string(home ? home : "") + "/.cache/tandem/tokenizers/" + n);
  }
  for (const std::string& dir : dirs) {
    text::Tokenizer tok;
    try {
      tok = text::Tokenizer::load(dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "skip %s: %s\n", dir.c_str(), e.what());
      continue;
    }
    auto t0 = Clock::now();
    auto vocab = text::token_vocab(tok);
    const double build_ms = ms_since(t0);
    int usable = 0;
    for (uint8_t u : vocab->tokens.usable) usable += u;
    std::printf("%s: vocab %d (%d usable), trie %zu nodes, built in %.0f ms\n", dir.c_str(),
                tok.vocab_size(), usable, vocab->trie.nodes(), build_ms);
    for (const Case& c : kCases) {
      auto g = std::make_shared<const text::Grammar>(
          c.schema ? text::compile_json_schema(nlohmann::ordered_json::parse(c.schema), true)
                   : text::json_object_grammar());
      const std::vector<int32_t> ids = tok.encode(c.doc, false);
      Stats un{1e9, 1e9, 1e9, 0}, cold{1e9, 1e9, 1e9, 0}, warm{1e9, 1e9, 1e9, 0};
      size_t hits = 0, misses = 0;
      for (int pass = 0; pass < 3; ++pass) {
        Stats a = replay(g, *vocab, ids, nullptr);
        text::MaskCache cache;
        Stats b = replay(g, *vocab, ids, &cache);
        Stats w = replay(g, *vocab, ids, &cache);
        if (a.mean < un.mean) un = a;
        if (b.mean < cold.mean) {
          cold = b;
          hits = cache.hits();
          misses = cache.misses();
        }
        if (w.mean < warm.mean) warm = w;
      }
      std::printf(
          "  %-14s %3d steps | uncached mean %.3f ms p50 %.3f max %.3f | cold cache mean %.3f ms "
          "(%zu misses, %zu hits over both passes) | warm cache mean %.4f ms\n",
          c.name, un.steps, un.mean, un.p50, un.max, cold.mean, misses, hits, warm.mean);
    }
    // Applying a mask to one row of logits (the engine's loop).
    std::vector<float> logits(size_t(tok.vocab_size()), 0.5f);
    text::GrammarMatcher m(std::make_shared<const text::Grammar>(text::json_object_grammar()));
    m.accept("{\"a\": \"");
    auto mask = m.mask(vocab->trie);
    t0 = Clock::now();
    const int reps = 200;
    for (int r = 0; r < reps; ++r)
      for (size_t i = 0; i < logits.size(); ++i)
        if (!mask->allows(int32_t(i))) logits[i] = -std::numeric_limits<float>::infinity();
    std::printf("  applying a mask to the logits: %.3f ms per step\n", ms_since(t0) / reps);
  }
  return 0;
}
