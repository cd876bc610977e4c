#include "coherence/script.h"

#include "text/unicode.h"

namespace tandem::coherence {

namespace {

struct ScriptRange {
  char32_t first, last;
  Script script;
};

// Letter ranges, sorted by first code point. Punctuation and digits inside
// the blocks are carved out where they are common in model output.
constexpr ScriptRange kRanges[] = {
    {U'A', U'Z', Script::Latin},
    {U'a', U'z', Script::Latin},
    {0x00AA, 0x00AA, Script::Latin},
    {0x00B5, 0x00B5, Script::Latin},
    {0x00BA, 0x00BA, Script::Latin},
    {0x00C0, 0x00D6, Script::Latin},
    {0x00D8, 0x00F6, Script::Latin},
    {0x00F8, 0x02AF, Script::Latin},
    {0x0370, 0x0373, Script::Greek},
    {0x0376, 0x037D, Script::Greek},
    {0x037F, 0x037F, Script::Greek},
    {0x0386, 0x0386, Script::Greek},
    {0x0388, 0x03FF, Script::Greek},
    {0x0400, 0x0481, Script::Cyrillic},
    {0x048A, 0x052F, Script::Cyrillic},
    {0x0531, 0x0556, Script::Armenian},
    {0x0560, 0x0588, Script::Armenian},
    {0x05D0, 0x05EA, Script::Hebrew},
    {0x05EF, 0x05F2, Script::Hebrew},
    {0x0620, 0x064A, Script::Arabic},
    {0x066E, 0x06D3, Script::Arabic},
    {0x06D5, 0x06D5, Script::Arabic},
    {0x06FA, 0x06FF, Script::Arabic},
    {0x0750, 0x077F, Script::Arabic},
    {0x08A0, 0x08C9, Script::Arabic},
    {0x0904, 0x0939, Script::Indic},
    {0x093D, 0x093D, Script::Indic},
    {0x0950, 0x0950, Script::Indic},
    {0x0958, 0x0961, Script::Indic},
    {0x0971, 0x0DFF, Script::Indic},  // Bengali .. Sinhala (marks included)
    {0x0E01, 0x0E30, Script::Thai},
    {0x0E32, 0x0E33, Script::Thai},
    {0x0E40, 0x0E46, Script::Thai},
    {0x0E81, 0x0EDF, Script::Other},  // Lao
    {0x0F00, 0x0F00, Script::Other},  // Tibetan
    {0x0F40, 0x0F6C, Script::Other},
    {0x1000, 0x102A, Script::Other},  // Myanmar
    {0x10A0, 0x10FF, Script::Georgian},
    {0x1100, 0x11FF, Script::Cjk},    // Hangul Jamo
    {0x1200, 0x135A, Script::Other},  // Ethiopic
    {0x13A0, 0x13FD, Script::Other},  // Cherokee
    {0x1780, 0x17B3, Script::Other},  // Khmer
    {0x1820, 0x1878, Script::Other},  // Mongolian
    {0x1C80, 0x1C88, Script::Cyrillic},
    {0x1C90, 0x1CBF, Script::Georgian},
    {0x1E00, 0x1EFF, Script::Latin},
    {0x1F00, 0x1FBC, Script::Greek},
    {0x1FC2, 0x1FCC, Script::Greek},
    {0x1FD0, 0x1FDB, Script::Greek},
    {0x1FE0, 0x1FEC, Script::Greek},
    {0x1FF2, 0x1FFC, Script::Greek},
    {0x2C60, 0x2C7F, Script::Latin},
    {0x2D00, 0x2D2D, Script::Georgian},
    {0x2DE0, 0x2DFF, Script::Cyrillic},
    {0x3005, 0x3007, Script::Cjk},  // 々 〆 〇
    {0x3041, 0x3096, Script::Cjk},  // Hiragana
    {0x309D, 0x309F, Script::Cjk},
    {0x30A1, 0x30FA, Script::Cjk},  // Katakana
    {0x30FC, 0x30FF, Script::Cjk},
    {0x3105, 0x312F, Script::Cjk},  // Bopomofo
    {0x3131, 0x318E, Script::Cjk},  // Hangul compatibility Jamo
    {0x31F0, 0x31FF, Script::Cjk},
    {0x3400, 0x4DBF, Script::Cjk},
    {0x4E00, 0x9FFF, Script::Cjk},
    {0xA640, 0xA69F, Script::Cyrillic},
    {0xA720, 0xA7FF, Script::Latin},
    {0xA960, 0xA97C, Script::Cjk},
    {0xAB30, 0xAB6F, Script::Latin},
    {0xAC00, 0xD7A3, Script::Cjk},  // Hangul syllables
    {0xD7B0, 0xD7FB, Script::Cjk},
    {0xF900, 0xFAFF, Script::Cjk},
    {0xFB00, 0xFB06, Script::Latin},
    {0xFB1D, 0xFB4F, Script::Hebrew},
    {0xFB50, 0xFDFB, Script::Arabic},
    {0xFE70, 0xFEFC, Script::Arabic},
    {0xFF21, 0xFF3A, Script::Latin},
    {0xFF41, 0xFF5A, Script::Latin},
    {0xFF66, 0xFF9F, Script::Cjk},  // halfwidth Katakana
    {0xFFA0, 0xFFDC, Script::Cjk},  // halfwidth Hangul
    {0x20000, 0x3134F, Script::Cjk},
};

bool is_digit(char32_t cp) {
  return (cp >= U'0' && cp <= U'9') || (cp >= 0xFF10 && cp <= 0xFF19) ||
         (cp >= 0x0660 && cp <= 0x0669) || (cp >= 0x06F0 && cp <= 0x06F9) ||
         (cp >= 0x0966 && cp <= 0x096F);
}

bool is_combining_mark(char32_t cp) {
  return (cp >= 0x0300 && cp <= 0x036F) || (cp >= 0x0483 && cp <= 0x0489) ||
         (cp >= 0x0591 && cp <= 0x05C7) || (cp >= 0x064B && cp <= 0x065F) ||
         (cp >= 0x0900 && cp <= 0x0903) || (cp >= 0x093A && cp <= 0x094F) ||
         (cp >= 0x0E31 && cp <= 0x0E3A) || (cp >= 0x0E47 && cp <= 0x0E4E) ||
         (cp >= 0x1AB0 && cp <= 0x1AFF) || (cp >= 0x1DC0 && cp <= 0x1DFF) ||
         (cp >= 0x3099 && cp <= 0x309A) || (cp >= 0xFE20 && cp <= 0xFE2F);
}

}  // namespace

const char* script_name(Script s) {
  switch (s) {
    case Script::None: return "none";
    case Script::Latin: return "Latin";
    case Script::Greek: return "Greek";
    case Script::Cyrillic: return "Cyrillic";
    case Script::Armenian: return "Armenian";
    case Script::Hebrew: return "Hebrew";
    case Script::Arabic: return "Arabic";
    case Script::Indic: return "Indic";
    case Script::Thai: return "Thai";
    case Script::Georgian: return "Georgian";
    case Script::Cjk: return "CJK";
    case Script::Other: return "other";
  }
  return "?";
}

std::string script_set_name(ScriptSet set) {
  std::string out;
  for (int i = 1; i < kScriptCount; ++i) {
    if (!(set & script_bit(Script(i)))) continue;
    if (!out.empty()) out += '+';
    out += script_name(Script(i));
  }
  return out.empty() ? "none" : out;
}

Script script_of(char32_t cp) {
  size_t lo = 0, hi = sizeof(kRanges) / sizeof(kRanges[0]);
  while (lo < hi) {  // the first range whose last >= cp
    const size_t mid = (lo + hi) / 2;
    if (kRanges[mid].last < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < sizeof(kRanges) / sizeof(kRanges[0]) && kRanges[lo].first <= cp) {
    return kRanges[lo].script;
  }
  return Script::None;
}

bool is_word_char(char32_t cp) {
  return is_digit(cp) || is_combining_mark(cp) || script_of(cp) != Script::None;
}

bool is_ideographic(char32_t cp) {
  return (cp >= 0x3005 && cp <= 0x3007) || (cp >= 0x3041 && cp <= 0x30FF && cp != 0x30FB) ||
         (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0xFF66 && cp <= 0xFF9F) ||
         (cp >= 0x20000 && cp <= 0x3134F);
}

ScriptSet scripts_in(std::string_view text) {
  ScriptSet set = 0;
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const int n = text::decode_utf8(text, i, &cp);
    if (n == 0) {
      ++i;
      continue;
    }
    set |= script_bit(script_of(cp));
    i += size_t(n);
  }
  return set;
}

char32_t to_lower(char32_t cp) {
  if (cp < 0x80) return cp >= U'A' && cp <= U'Z' ? cp + 32 : cp;
  if ((cp >= 0x00C0 && cp <= 0x00DE && cp != 0x00D7) || (cp >= 0x0391 && cp <= 0x03AB) ||
      (cp >= 0x0410 && cp <= 0x042F) || (cp >= 0xFF21 && cp <= 0xFF3A))
    return cp + 0x20;
  if (cp >= 0x0400 && cp <= 0x040F) return cp + 0x50;
  if (cp >= 0x0531 && cp <= 0x0556) return cp + 0x30;
  if (cp == 0x0178) return 0x00FF;
  if (cp == 0x0386) return 0x03AC;
  if (cp >= 0x0388 && cp <= 0x038A) return cp + 0x25;
  if (cp == 0x038C) return 0x03CC;
  if (cp == 0x038E || cp == 0x038F) return cp + 0x3F;
  // Alternating capital/small pairs: capital at the even (or odd) code point.
  const bool even_upper = (cp >= 0x0100 && cp <= 0x0137) || (cp >= 0x014A && cp <= 0x0177) ||
                          (cp >= 0x0460 && cp <= 0x0481) || (cp >= 0x048A && cp <= 0x04BF) ||
                          (cp >= 0x04D0 && cp <= 0x052F) || (cp >= 0x1E00 && cp <= 0x1E95) ||
                          (cp >= 0x1EA0 && cp <= 0x1EFF);
  if (even_upper) return cp % 2 == 0 ? cp + 1 : cp;
  const bool odd_upper = (cp >= 0x0139 && cp <= 0x0148) || (cp >= 0x0179 && cp <= 0x017E) ||
                         (cp >= 0x04C1 && cp <= 0x04CE);
  if (odd_upper) return cp % 2 == 1 ? cp + 1 : cp;
  return cp;
}

std::string fold_case(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const int n = text::decode_utf8(text, i, &cp);
    if (n == 0) {  // not valid UTF-8: the byte as it is
      out += text[i++];
      continue;
    }
    i += size_t(n);
    if (cp == 0x00DF || cp == 0x1E9E) {
      out += "ss";
      continue;
    }
    if (cp == 0x03C2) cp = 0x03C3;  // final sigma
    text::append_utf8(out, to_lower(cp));
  }
  return out;
}

}  // namespace tandem::coherence
