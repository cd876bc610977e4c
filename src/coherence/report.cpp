#include "coherence/report.h"

#include "core/error.h"
#include "text/unicode.h"

namespace tandem::coherence {

std::string one_line(const std::string& raw, size_t max_bytes) {
  const std::string text = text::utf8_lossy(raw);
  std::string out;
  size_t i = 0;
  for (; i < text.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7F) {
      out += strprintf("\\u%04x", c);
    } else {
      out += char(c);
    }
  }
  if (i < text.size()) {
    // Drop a code point cut in the middle (its lead byte and what followed).
    size_t lead = out.size();
    while (lead > 0 && (static_cast<unsigned char>(out[lead - 1]) & 0xC0) == 0x80) --lead;
    if (lead > 0 && static_cast<unsigned char>(out[lead - 1]) >= 0xC0 &&
        out.size() - (lead - 1) < size_t(text::utf8_len(static_cast<unsigned char>(out[lead - 1]))))
      out.resize(lead - 1);
    out += "...";
  }
  return out;
}

std::string case_line(const CaseResult& r) {
  std::string line =
      strprintf("%s %s  %.2f s", r.pass ? "PASS" : "FAIL", r.id.c_str(), r.reply.latency_s);
  if (r.reply.status == Reply::Status::Ok) {
    line += "  \"" + one_line(r.reply.content, 120) + "\"";
    if (r.reply.finish_reason == "length") line += " (cut at max_tokens)";
  }
  if (!r.pass) line += "  " + r.kind + ": " + r.reason;
  return line;
}

std::string summary_line(const RunInfo& info, const std::vector<CaseResult>& results) {
  size_t passed = 0;
  for (const CaseResult& r : results) passed += r.pass;
  std::string where = "set " + info.set_name;
  if (!info.model.empty()) where += ", model " + info.model;
  where += ", " + info.url;
  return strprintf("coherence: %zu of %zu passed, %zu failed (%s)", passed, results.size(),
                   results.size() - passed, where.c_str());
}

nlohmann::json json_report(const RunInfo& info, const std::vector<CaseResult>& results) {
  nlohmann::json cases = nlohmann::json::array();
  size_t passed = 0;
  for (const CaseResult& r : results) {
    passed += r.pass;
    cases.push_back({{"id", r.id},
                     {"pass", r.pass},
                     {"kind", r.kind},
                     {"reason", r.reason},
                     {"answer", text::utf8_lossy(r.reply.content)},
                     {"reasoning", text::utf8_lossy(r.reply.reasoning)},
                     {"finish_reason", r.reply.finish_reason},
                     {"http_status", r.reply.http_status},
                     {"latency_s", r.reply.latency_s}});
  }
  return {{"set", info.set_name}, {"source", info.set_source},         {"url", info.url},
          {"model", info.model},  {"ok", passed == results.size()},    {"total", results.size()},
          {"passed", passed},     {"failed", results.size() - passed}, {"cases", cases}};
}

}  // namespace tandem::coherence
