#include "text/reasoning_parser.h"

#include "text/text_scan.h"

namespace tandem::text {

namespace {

// A channel name line ("thought\n") longer than this is not a name: the
// block's text starts right after the open marker.
constexpr size_t kMaxChannelName = 32;

}  // namespace

const char* reasoning_format_name(ReasoningFormat f) {
  switch (f) {
    case ReasoningFormat::None: return "none";
    case ReasoningFormat::Think: return "think";
    case ReasoningFormat::GemmaChannel: return "gemma4-channel";
    case ReasoningFormat::MistralThink: return "mistral-think";
  }
  return "none";
}

ReasoningParser::ReasoningParser(ReasoningFormat format, bool starts_in_reasoning)
    : format_(format) {
  switch (format) {
    case ReasoningFormat::None: break;
    case ReasoningFormat::Think:
      open_ = "<think>";
      close_ = "</think>";
      break;
    case ReasoningFormat::GemmaChannel:
      open_ = "<|channel>";
      close_ = "<channel|>";
      anywhere_ = true;
      named_ = true;
      break;
    case ReasoningFormat::MistralThink:
      open_ = "[THINK]";
      close_ = "[/THINK]";
      anywhere_ = true;
      break;
  }
  if (format == ReasoningFormat::None)
    state_ = State::Content;
  else if (starts_in_reasoning)
    state_ = State::Reasoning;
  else
    state_ = anywhere_ ? State::Content : State::Start;
}

ReasoningDelta ReasoningParser::push(std::string_view text) {
  ReasoningDelta out;
  buf_.append(text);
  run(out, false);
  return out;
}

ReasoningDelta ReasoningParser::flush() {
  ReasoningDelta out;
  run(out, true);
  buf_.clear();  // a channel name, or whitespace around a block
  return out;
}

void ReasoningParser::run(ReasoningDelta& out, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::Start: {
        // Only whitespace may precede the block at the start of the output.
        const size_t i = skip_space(buf_, 0);
        if (i == buf_.size()) {
          if (at_end) {
            out.content += buf_;
            buf_.clear();
          }
          return;
        }
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.starts_with(open_)) {
          buf_.erase(0, i + open_.size());
          state_ = named_ ? State::Header : State::Reasoning;
          block_started_ = false;
          continue;
        }
        if (!at_end && std::string_view(open_).starts_with(rest)) return;
        state_ = State::Content;
        continue;
      }
      case State::Content: {
        if (!anywhere_) {
          out.content += buf_;
          buf_.clear();
          return;
        }
        const size_t p = buf_.find(open_);
        if (p != std::string::npos) {
          out.content.append(buf_, 0, p);
          buf_.erase(0, p + open_.size());
          state_ = named_ ? State::Header : State::Reasoning;
          block_started_ = false;
          continue;
        }
        const size_t keep = at_end ? 0 : partial_marker_suffix(buf_, open_);
        out.content.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::Header: {
        // "thought\n": the channel's name, dropped. Decided only on what the
        // first kMaxChannelName bytes hold, so chunking cannot change it.
        const size_t nl = buf_.find('\n');
        const size_t c = buf_.find(close_);
        if (c != std::string::npos && c < kMaxChannelName && (nl == std::string::npos || c < nl)) {
          buf_.erase(0, c + close_.size());
          state_ = State::AfterClose;
          continue;
        }
        if (nl != std::string::npos && nl < kMaxChannelName) {
          buf_.erase(0, nl + 1);
          state_ = State::Reasoning;
          continue;
        }
        if (buf_.size() >= kMaxChannelName + close_.size()) {
          state_ = State::Reasoning;  // no name line: the text is reasoning
          continue;
        }
        if (at_end) buf_.clear();  // a bare channel name
        return;
      }
      case State::Reasoning: {
        const size_t c = buf_.find(close_);
        size_t end = c != std::string::npos ? c
                     : at_end               ? buf_.size()
                                            : buf_.size() - partial_marker_suffix(buf_, close_);
        // Trailing whitespace waits: it is dropped before a close.
        while (end > 0 && is_space(buf_[end - 1])) --end;
        const size_t begin = block_started_ ? 0 : skip_space(buf_, 0);
        if (begin < end) {
          out.reasoning.append(buf_, begin, end - begin);
          block_started_ = true;
        }
        if (c != std::string::npos) {
          buf_.erase(0, c + close_.size());
          state_ = State::AfterClose;
          continue;
        }
        if (begin < end) buf_.erase(0, end);
        return;
      }
      case State::AfterClose: {
        buf_.erase(0, skip_space(buf_, 0));
        if (buf_.empty()) return;
        state_ = State::Content;
        continue;
      }
    }
  }
}

bool prompt_opens_reasoning(ReasoningFormat format, std::string_view tail) {
  while (!tail.empty() && is_space(tail.back())) tail.remove_suffix(1);
  switch (format) {
    case ReasoningFormat::None: return false;
    case ReasoningFormat::Think: return tail.ends_with("<think>");
    case ReasoningFormat::GemmaChannel:
    case ReasoningFormat::MistralThink: {
      const bool gemma = format == ReasoningFormat::GemmaChannel;
      const size_t open = tail.rfind(gemma ? "<|channel>" : "[THINK]");
      if (open == std::string_view::npos) return false;
      const size_t close = tail.rfind(gemma ? "<channel|>" : "[/THINK]");
      return close == std::string_view::npos || close < open;
    }
  }
  return false;
}

}  // namespace tandem::text
