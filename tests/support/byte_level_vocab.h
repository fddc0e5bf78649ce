// Byte-level (Llama 3 style) vocabularies for tests: the 256 byte tokens, merges learned from a small English
// text by counting pairs (the way BPE vocabularies are trained), and Llama 3's special tokens at the end.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/byte_level_bpe.h"

namespace shardline::test {

inline constexpr const char* kByteLevelCorpus =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
    "friends. One day, she saw a big tree with 123 red apples! \"Can I have one?\" she asked her mother. Her "
    "mother said, \"Yes, but be careful.\" Lily's friend Tom didn't want to climb; he'd rather sing.\n\n"
    "They played together until the sun went down, and then they went home happy. The end.\n";

// GPT-2's spelling of a byte string (runtime::byte_level_spelling, byte by byte).
inline std::string byte_level_spelled(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) out += runtime::byte_level_spelling(static_cast<unsigned char>(c));
  return out;
}

// A vocabulary of exactly `size` tokens (>= 256 + 3): bytes 0..255 as tokens 0..255 (types normal), then up to
// size - 259 merges learned from kByteLevelCorpus split into words with their leading space, then
// "<|begin_of_text|>" (BOS), "<|end_of_text|>" (EOS) and "<|eot_id|>" (EOT), types control.
inline runtime::ByteLevelVocabulary make_byte_level_vocabulary(int size) {
  runtime::ByteLevelVocabulary v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(runtime::byte_level_spelling(static_cast<unsigned char>(b)));
  // The corpus as words, each a list of symbols (its bytes' spellings), " " kept at the front of a word.
  std::vector<std::vector<std::string>> words;
  const std::string text = kByteLevelCorpus;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t j = i + 1;
    while (j < text.size() && text[j] != ' ') ++j;
    std::vector<std::string> word;
    for (std::size_t k = i; k < j; ++k) word.push_back(runtime::byte_level_spelling(static_cast<unsigned char>(text[k])));
    words.push_back(std::move(word));
    i = j;
  }
  const int merges = size - 256 - 3;
  while (static_cast<int>(v.merges.size()) < merges) {
    std::map<std::pair<std::string, std::string>, int> counts;  // ordered: ties go to the smallest pair
    for (const auto& word : words) {
      for (std::size_t k = 0; k + 1 < word.size(); ++k) ++counts[{word[k], word[k + 1]}];
    }
    if (counts.empty()) break;
    const auto best = std::max_element(counts.begin(), counts.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    const auto [left, right] = best->first;
    v.merges.push_back(left + " " + right);
    v.tokens.push_back(left + right);
    for (auto& word : words) {
      for (std::size_t k = 0; k + 1 < word.size(); ++k) {
        if (word[k] == left && word[k + 1] == right) {
          word[k] += word[k + 1];
          word.erase(word.begin() + static_cast<long>(k) + 1);
        }
      }
    }
  }
  while (static_cast<int>(v.tokens.size()) < size - 3) v.tokens.push_back("<|reserved_" + std::to_string(v.tokens.size()) + "|>");
  v.types.assign(v.tokens.size(), static_cast<int>(runtime::TokenType::kNormal));
  for (std::size_t i = 256 + v.merges.size(); i < v.tokens.size(); ++i) v.types[i] = static_cast<int>(runtime::TokenType::kControl);
  for (const char* special : {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"}) {
    v.tokens.push_back(special);
    v.types.push_back(static_cast<int>(runtime::TokenType::kControl));
  }
  v.bos_id = size - 3;
  v.end_ids = {size - 2, size - 1};
  return v;
}

}  // namespace shardline::test
