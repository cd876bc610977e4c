// Detokenizer; see detokenizer.h.
#include "text/detokenizer.h"

#include "text/tokenizer_core.h"

namespace tandem::text {

Detokenizer::Detokenizer(std::shared_ptr<const TokenizerCore> core, bool skip_special)
    : core_(std::move(core)), skip_special_(skip_special), runner_(core_->decoder) {}

std::string Detokenizer::push(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= core_->tokens.size()) return {};
  if (skip_special_ && core_->special[id]) return {};
  if (core_->tokens[id].empty()) return {};  // an unused id (gap in the vocab)
  return runner_.push(core_->tokens[id]);
}

std::string Detokenizer::flush() {
  std::string out = runner_.flush();
  runner_ = ChainRunner(core_->decoder);
  return out;
}

void Detokenizer::reset() {
  runner_ = ChainRunner(core_->decoder);
}

}  // namespace tandem::text
