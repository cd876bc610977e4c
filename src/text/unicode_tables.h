// Raw Unicode data tables for normalization, generated into
// unicode_tables.cpp by tools/gen_unicode_tables.py. Every table is sorted by
// its first field so lookups can binary-search. Use text/unicode.h, not these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::text::tables {

struct CccRun {  // code points first..last all have canonical combining class ccc
  char32_t first, last;
  uint8_t ccc;
};
struct Decomp {  // full decomposition of cp: kDecompData[offset .. offset+len)
  char32_t cp;
  uint8_t compat;  // 0: canonical (NFD); 1: compatibility (NFKD), only where it differs
  uint32_t offset;
  uint8_t len;
};
struct Pair {  // canonical composition: first + second -> composite
  char32_t first, second, composite;
};
struct Range {
  char32_t first, last;
};

extern const char* const kUnicodeVersion;
extern const CccRun kCcc[];
extern const size_t kCccCount;
extern const Decomp kDecomp[];  // sorted by (cp, compat)
extern const size_t kDecompCount;
extern const char32_t kDecompData[];
extern const Pair kPairs[];  // sorted by (first, second)
extern const size_t kPairCount;
// Code points that may make a string non-NFC / non-NFKC; a string without any
// of them is already normalized.
extern const Range kNfcUnstable[];
extern const size_t kNfcUnstableCount;
extern const Range kNfkcUnstable[];
extern const size_t kNfkcUnstableCount;

}  // namespace tandem::text::tables
