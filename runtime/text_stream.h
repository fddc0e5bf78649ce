// The text a sequence's tokens write, piece by piece: Engine::generate's text and generated_text, and what
// `run` streams. A llama2.c or SentencePiece vocabulary spells a character it has no piece for in byte
// tokens (U+1F999 is <0xF0><0x9F><0xA6><0x99>): their bytes are held until they complete a UTF-8
// character, which is then written whole. Bytes that cannot complete one (a stray continuation byte, a
// character cut short by another token) are dropped, as are C1 controls and bidi overrides spelled in
// bytes, which a terminal would act on (a vocabulary's own multi-byte pieces are written as they are, as
// run.c writes them). llama2.c's run.c (safe_printf) drops every byte token above 0x7F, so it prints no
// such character at all; text made of whole pieces is written as run.c writes it. A byte-level vocabulary
// (Llama 3) writes every piece as it is (Tokenizer::prints).
#pragma once

#include <string>
#include <string_view>

#include "runtime/tokenizer.h"

namespace shardline::runtime {

class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // What `piece` (a Tokenizer::decode() result) adds to the text: "" while a character's bytes are still
  // incomplete, and for pieces that are not written. Valid until the next call.
  std::string_view add(std::string_view piece);
  // The prompt's text ends here: bytes it left incomplete are dropped, so the generated text holds only what
  // the model generated.
  void end_prompt() { pending_.clear(); }

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;    // the first bytes of a UTF-8 character spelled in byte tokens
  std::string completed_;  // add()'s result when a byte completes the character
};

}  // namespace shardline::runtime
