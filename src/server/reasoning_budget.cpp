#include "server/reasoning_budget.h"

namespace tandem::server {

namespace {

struct Budget {
  int32_t budget = 0, open = -1, close = -1;
  bool starts_open = false;
  std::vector<uint64_t> all, only_close;
};

class BudgetConstraint : public TokenConstraint {
 public:
  explicit BudgetConstraint(std::shared_ptr<const Budget> b)
      : b_(std::move(b)), open_(b_->starts_open) {}

  Allowed allowed() override {
    if (open_ && used_ >= b_->budget) return {&b_->only_close, false, true};
    return {&b_->all, true, true};
  }

  bool accept(int32_t id) override {
    if (open_ && used_ >= b_->budget && id != b_->close) return false;
    if (done_) return true;
    if (!open_) {
      open_ = id == b_->open;
    } else if (id == b_->close) {
      open_ = false;
      done_ = true;
    } else {
      ++used_;
    }
    return true;
  }

 private:
  std::shared_ptr<const Budget> b_;
  bool open_, done_ = false;
  int32_t used_ = 0;
};

class BudgetFactory : public ConstraintFactory {
 public:
  explicit BudgetFactory(std::shared_ptr<const Budget> b) : b_(std::move(b)) {}
  std::unique_ptr<TokenConstraint> start() const override {
    return std::make_unique<BudgetConstraint>(b_);
  }

 private:
  std::shared_ptr<const Budget> b_;
};

}  // namespace

std::shared_ptr<const ConstraintFactory> reasoning_budget_constraint(int32_t budget,
                                                                     const ChatOutputConfig& output,
                                                                     const PromptBuilder& builder,
                                                                     int64_t vocab) {
  const std::vector<std::string> markers = text::reasoning_markers(output.reasoning);
  if (markers.size() != 2 || vocab <= 0) return nullptr;
  auto b = std::make_shared<Budget>();
  b->budget = budget;
  b->open = builder.single_token(markers[0]);
  b->close = builder.single_token(markers[1]);
  b->starts_open = output.starts_in_reasoning;
  if (b->close < 0 || b->close >= vocab) return nullptr;
  const size_t words = size_t(vocab + 63) / 64;
  b->all.assign(words, ~uint64_t(0));
  b->only_close.assign(words, 0);
  b->only_close[size_t(b->close) / 64] |= uint64_t(1) << (b->close % 64);
  return std::make_shared<BudgetFactory>(b);
}

}  // namespace tandem::server
