// Decoders of the HF `tokenizers` format ("decoder" in tokenizer.json), in
// streaming form: each stage consumes token strings one at a time and emits
// strings, holding back only what a later token could still change. Running
// a whole id sequence through the chain and flushing gives exactly
// `tokenizers`' batch decode; streaming the same ids gives the same text.
//
// Stages: Replace (String pattern), ByteFallback (runs of <0xNN> tokens become
// their bytes if those form valid UTF-8, else one U+FFFD per byte), Fuse,
// Strip, ByteLevel (alphabet chars back to bytes, then lossy UTF-8 exactly as
// Rust's from_utf8_lossy), Metaspace, and Sequence of these. With no decoder,
// tokens are joined with single spaces, as `tokenizers` does.
// After a fusing stage (Fuse, ByteLevel) the tokens are one string for
// `tokenizers`; here they are chunks of it, so only stages that act the same
// on chunks are accepted there (Replace of one code point, Strip); others
// throw at load time.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::text {

class DecodeStage {
 public:
  virtual ~DecodeStage() = default;
  // A copy with the configuration and fresh (empty) streaming state.
  virtual std::unique_ptr<DecodeStage> fresh() const = 0;
  // Consumes one token (or chunk), appends what is final to out.
  virtual void push(std::string tok, std::vector<std::string>& out) = 0;
  // End of stream: appends whatever was held back.
  virtual void flush(std::vector<std::string>& out) {}
  // True when later stages see one fused string instead of tokens.
  virtual bool fuses() const { return false; }
};

using DecoderChain = std::vector<std::unique_ptr<DecodeStage>>;

// Builds the chain for a "decoder" JSON value (null: join with spaces).
DecoderChain decoder_from_json(const nlohmann::json& j);
// The chain of a byte-level BPE (tekken): ByteLevel alone.
DecoderChain byte_level_decoder();
DecoderChain clone_chain(const DecoderChain& c);

// Runs tokens through a chain (streaming); the concatenation of all outputs
// and of flush() is the decoded text.
class ChainRunner {
 public:
  explicit ChainRunner(const DecoderChain& proto) : chain_(clone_chain(proto)) {}
  std::string push(std::string tok);
  std::string flush();

 private:
  DecoderChain chain_;
  std::vector<std::string> a_, b_;
};

}  // namespace tandem::text
