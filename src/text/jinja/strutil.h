// Python str semantics over UTF-8 std::string: code-point length, indexing,
// whitespace (str.isspace), case mapping, strip/split/replace/title. Strings
// that are not valid UTF-8 are treated byte-wise (each bad byte one "char").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja::str {

// Decodes one code point at s[i], advancing i. Invalid bytes decode as
// themselves (0x80..0xFF) and advance by one.
uint32_t decode(std::string_view s, size_t& i);
void append_utf8(std::string& out, uint32_t cp);
std::vector<uint32_t> to_cps(std::string_view s);
std::string from_cps(const uint32_t* cps, size_t n);
inline std::string from_cps(const std::vector<uint32_t>& v) {
  return from_cps(v.data(), v.size());
}

bool is_ascii(std::string_view s);
size_t length(std::string_view s);  // number of code points

bool is_space(uint32_t cp);  // Python str.isspace
bool is_alpha(uint32_t cp);  // letters with a case (approximation of str.isalpha)
bool is_digit(uint32_t cp);  // ASCII and a few common digit blocks
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);
bool is_printable(uint32_t cp);  // Python str.isprintable, approximated

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);   // str.capitalize
std::string py_title(std::string_view s);     // str.title
std::string jinja_title(std::string_view s);  // Jinja's |title filter
std::string swapcase(std::string_view s);

// strip/lstrip/rstrip: chars == nullptr means whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);

// str.split(sep, maxsplit); sep == nullptr splits on whitespace runs.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
size_t count(std::string_view s, std::string_view sub);

// Python-style index normalization over code points.
bool starts_with(std::string_view s, std::string_view p);
bool ends_with(std::string_view s, std::string_view p);

std::string html_escape(std::string_view s);  // markupsafe.escape

}  // namespace tandem::jinja::str
