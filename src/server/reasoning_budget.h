// A reasoning budget (Anthropic's thinking.budget_tokens, chat's
// `thinking_budget` extension) as a token constraint: once the model has
// written `budget` tokens inside its reasoning block, the next token must be
// the block's closing marker (</think>, <channel|>, [/THINK]); every other
// token is free. The block opens with its opening marker token (or at the
// start, when the prompt opened it) and closes with the closing one, after
// which nothing is constrained.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/constraint.h"
#include "server/chat_output.h"
#include "server/prompt_builder.h"

namespace tandem::server {

// Null when the model writes no reasoning, or its closing marker is not one
// token (the budget is then not enforced).
std::shared_ptr<const ConstraintFactory> reasoning_budget_constraint(int32_t budget,
                                                                     const ChatOutputConfig& output,
                                                                     const PromptBuilder& builder,
                                                                     int64_t vocab);

}  // namespace tandem::server
