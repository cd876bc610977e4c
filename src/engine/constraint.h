// Constrained decoding, as the engine sees it: a per-sequence object that
// says which tokens may come next and follows the tokens chosen. The server
// builds them (server/structured_output.h: a JSON-schema grammar over the
// tokenizer's vocabulary); the engine applies them the same way on the text
// and vision lanes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  struct Allowed {
    const std::vector<uint64_t>* bits = nullptr;  // bitset over ids; ids past it are disallowed
    bool can_end = false;    // the output may end here (end-of-sequence allowed)
    bool any_token = false;  // some token is allowed
  };
  // The tokens allowed next. The pointers stay valid until the next call.
  virtual Allowed allowed() = 0;
  // Follows the chosen token; false when the constraint does not allow it.
  virtual bool accept(int32_t id) = 0;
};

// Makes one TokenConstraint per sequence (GenerationParams::constraint).
class ConstraintFactory {
 public:
  virtual ~ConstraintFactory() = default;
  virtual std::unique_ptr<TokenConstraint> start() const = 0;
};

}  // namespace tandem
