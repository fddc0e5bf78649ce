// Special tokens written in a prompt ("<s>", "</s>", "<|eot_id|>", "<|start_header_id|>") become their ids,
// as llama.cpp's prompts parse them (llama_tokenize with parse_special): a GGUF file's control, user-defined
// and unknown tokens are matched in the text, longest token first, so a chat template can be the prompt.
//
// The order is llama.cpp's tokenizer_st_partition: each special token in turn, longest first, takes its
// occurrences from the left in the text no longer special token has taken. With "ab" and "bcd" special,
// "abcd" is a, bcd (not ab, cd): the longer token claims its text first, wherever it starts.
//
// Example: with "</s>" (id 2) special, split("Hi</s>\nYou") = {"Hi"}, {2}, {"\nYou"}.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardline::runtime {

class SpecialTokens {
 public:
  // One stretch of the text: plain text to tokenize (id < 0), or a special token's id.
  struct Piece {
    std::string_view text;
    int id = -1;
  };

  SpecialTokens() = default;
  // (text, id) pairs; empty texts match nothing and are left out.
  explicit SpecialTokens(std::vector<std::pair<std::string, int>> specials);

  bool empty() const { return n_ == 0; }
  // The text cut at its special tokens, in order; plain pieces are never empty. The views point into text.
  std::vector<Piece> split(std::string_view text) const;

 private:
  struct Special {
    std::string text;
    int id;
    int rank;  // its place in llama.cpp's order: longest first
  };
  // By first byte: a position is compared only with the specials that start with its byte (a vocabulary of
  // thousands of user-defined tokens made every byte of a long prompt compare with all of them).
  std::array<std::vector<Special>, 256> by_first_byte_;
  int n_ = 0;
};

}  // namespace shardline::runtime
