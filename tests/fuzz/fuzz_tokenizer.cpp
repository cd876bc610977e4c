// libFuzzer target for the tokenizer and detokenizer.
//
// Build (clang only):
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DTANDEM_FUZZ=ON -DTANDEM_TESTS=OFF \
//     -DTANDEM_BENCH=OFF && ninja -C build-fuzz -j1 fuzz_tokenizer
// Run:
//   TANDEM_FUZZ_TOKENIZER=~/.cache/tandem/tokenizers/llama3_1 \
//     ./build-fuzz/fuzz_tokenizer -max_total_time=60 -max_len=512
// (default tokenizer: the synthetic tests/fixtures/tokenizer/tekken_tiny.json)
//
// Properties checked on arbitrary bytes (invalid UTF-8 included):
//  - encode never crashes and yields ids inside the vocabulary;
//  - for byte-level tokenizers without a normalizer, decode(encode(x)) equals
//    x after lossy UTF-8 repair (exact round trip);
//  - streaming detokenization of the ids, and of ids made from the raw input
//    bytes, concatenates to the batch decode and each piece is valid UTF-8.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/tokenizer_core.h"
#include "text/unicode.h"

namespace {

const tandem::text::Tokenizer& tokenizer() {
  static const tandem::text::Tokenizer tok = [] {
    const char* p = std::getenv("TANDEM_FUZZ_TOKENIZER");
    std::string path =
        p && *p ? std::string(p)
                : std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/tekken_tiny.json";
    return tandem::text::Tokenizer::load(path);
  }();
  return tok;
}

void check_stream(const tandem::text::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  tandem::text::Detokenizer d = tok.detokenizer(skip);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = d.push(id);
    if (!tandem::text::is_valid_utf8(piece)) std::abort();
    streamed += piece;
  }
  std::string tail = d.flush();
  if (!tandem::text::is_valid_utf8(tail)) std::abort();
  streamed += tail;
  if (streamed != tok.decode(ids, skip)) std::abort();
}

}  // namespace

// Loads the tokenizer before fuzzing starts: a real one (Gemma 3's 262K
// entries) takes ~10 s under ASan and coverage, which counted against the
// first input's -timeout when loaded lazily and failed the smoke run.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tok = tokenizer();
  std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids = tok.encode(input, true);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  std::vector<int32_t> plain = tok.encode(input, false);
  const auto& core = *tok.core();
  bool lossless = core.normalizer == nullptr && core.pre && core.pre->is_byte_level();
  if (lossless) {
    // Only when no added token was matched (their text passes unchanged too,
    // but skip-free decode keeps them; checked the same way).
    if (tok.decode(plain) != tandem::text::utf8_lossy(input)) std::abort();
  }
  check_stream(tok, ids, false);
  check_stream(tok, ids, true);
  // Arbitrary id sequences: two input bytes per id.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < size; i += 2)
    raw.push_back(static_cast<int32_t>((data[i] << 8 | data[i + 1]) % (tok.vocab_size() + 3)) - 1);
  check_stream(tok, raw, false);
  check_stream(tok, raw, true);
  return 0;
}
