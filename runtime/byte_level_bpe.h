// The byte-level BPE tokenizer of Llama 3 (GGUF tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "llama-bpe"),
// as llama.cpp and Hugging Face's tokenizers run it, so a Llama 3 GGUF file's prompts become the ids its
// model was trained on.
//
// How text becomes ids:
//   1. Special tokens (token_type control, user-defined or unknown: "<|begin_of_text|>", "<|eot_id|>", ...)
//      written in the text become their ids, longest first, as llama.cpp's prompts parse them
//      (special_tokens.h).
//   2. The text between them is split by Llama 3's pre-tokenizer regex (words with their leading space or
//      punctuation, numbers of up to 3 digits, runs of punctuation, of newlines, of spaces; PCRE2 with
//      Unicode properties).
//   3. Each piece's bytes are spelled in GPT-2's byte alphabet (each byte a printable code point: " " is
//      "Ġ", "\n" is "Ċ"), the way the vocabulary's tokens are spelled. A piece that is a token is that token
//      (Llama 3's tokenizer ignores merges for those); else its characters are merged pairwise, always the
//      adjacent pair of lowest rank in tokenizer.ggml.merges first (the leftmost of equal ranks).
// Decoding spells a token's characters back into bytes; control tokens decode to nothing.
//
// Example: with a vocabulary holding "Hello", "Ġworld" and "!", encode("Hello world!") = {Hello, Ġworld, !}.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/special_tokens.h"

namespace shardline::runtime {

// tokenizer.ggml.token_type's values (llama.cpp's llama_token_type).
enum class TokenType : int { kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
// The types whose text in a prompt becomes the token (llama.cpp's cache_special_tokens).
constexpr bool is_special_token_type(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUserDefined || type == TokenType::kUnknown;
}

// A byte-level vocabulary as a GGUF file holds it.
struct ByteLevelVocabulary {
  std::vector<std::string> tokens;  // spelled in GPT-2's byte alphabet (specials as plain text)
  std::vector<int> types;           // TokenType per token, or empty: all normal
  std::vector<std::string> merges;  // "left right", rank 0 first
  std::string pre = "llama-bpe";    // tokenizer.ggml.pre: which pre-tokenizer regex
  int bos_id = -1;                  // -1: none
  bool add_bos = true;              // tokenizer.ggml.add_bos_token
  std::vector<int> end_ids;         // the ids that end generation (EOS, EOT, EOM)
};

class ByteLevelBpe {
 public:
  // Throws FormatError naming `source` for a pre-tokenizer other than llama-bpe, ids out of range, a merge
  // without its space, types of another count than the tokens, or a byte without its token.
  ByteLevelBpe(ByteLevelVocabulary vocabulary, const std::string& source);
  ~ByteLevelBpe();
  ByteLevelBpe(const ByteLevelBpe&) = delete;
  ByteLevelBpe& operator=(const ByteLevelBpe&) = delete;

  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  int bos_id() const { return bos_id_; }
  bool add_bos() const { return add_bos_; }
  const std::vector<int>& end_ids() const { return end_ids_; }

  // Steps 1-3 above (no BOS). Throws ConfigError when text is not UTF-8.
  std::vector<int> encode(std::string_view text) const;
  // The bytes of `token` ("" for control, unknown and unused tokens). Valid as long as this object.
  std::string_view decode(int token) const;
  // The token as the vocabulary spells it.
  const std::string& token_text(int token) const { return tokens_.at(static_cast<std::size_t>(token)); }

 private:
  struct Regex;
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Index = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

  void encode_plain(std::string_view text, std::vector<int>& out) const;  // steps 2 and 3
  void encode_piece(std::string_view piece, std::vector<int>& out) const;  // step 3

  std::vector<std::string> tokens_;
  std::vector<std::string> decoded_;  // each token's bytes
  Index ids_;                         // token text -> lowest id spelled so
  Index merge_ranks_;                 // "left right" -> rank
  SpecialTokens specials_;
  int bos_id_ = -1;
  bool add_bos_ = true;
  std::vector<int> end_ids_;
  std::unique_ptr<Regex> pre_;
};

// GPT-2's spelling of byte b: one printable code point, as UTF-8 (b itself where printable, else U+0100 on).
const std::string& byte_level_spelling(unsigned char b);

}  // namespace shardline::runtime
