// The built-in demo model: models/gemma3-demo (a 5.6M-parameter Gemma 3 with
// a SigLIP tower, trained by tools/train/train_demo.py) linked into the
// binary, so `tandem serve` with no model answers sensibly on a machine with
// no network and no model folder.
#pragma once

#include <string>

namespace tandem::catalog {

// One file of the embedded checkpoint (generated/builtin_demo_model.cpp).
struct EmbeddedFile {
  const char* name;
  const char* begin;
  const char* end;
};
extern const EmbeddedFile kDemoModelFiles[];  // ends with {nullptr, ...}

// The name the demo model is served under.
inline constexpr const char* kDemoModelName = "gemma3-demo";

// A folder holding the demo checkpoint: written once to
// $TANDEM_CACHE (default $XDG_CACHE_HOME/tandem or ~/.cache/tandem)
// /demo/gemma3-demo-<content hash>, atomically (a temporary folder renamed
// into place), and reused after. Throws tandem::Error naming the folder when
// it cannot be written.
std::string demo_model_dir();

}  // namespace tandem::catalog
