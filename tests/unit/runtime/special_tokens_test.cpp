// Special tokens written in a prompt: the pieces llama.cpp's tokenizer_st_partition cuts a text into, with
// the longest special claiming its text first wherever it starts.
#include "runtime/special_tokens.h"

#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace shardline::runtime {
namespace {

// The pieces as strings: plain text as itself, a special as "#id".
std::vector<std::string> cut(const SpecialTokens& specials, std::string_view text) {
  std::vector<std::string> out;
  for (const SpecialTokens::Piece& piece : specials.split(text)) {
    out.push_back(piece.id >= 0 ? fmt::format("#{}", piece.id) : std::string(piece.text));
    EXPECT_FALSE(piece.text.empty());
  }
  return out;
}

using Pieces = std::vector<std::string>;

TEST(SpecialTokens, CutsTextAtEveryOccurrence) {
  const SpecialTokens specials({{"<s>", 1}, {"</s>", 2}, {"<unk>", 0}});
  EXPECT_EQ(cut(specials, "Hi</s>\nYou"), (Pieces{"Hi", "#2", "\nYou"}));
  EXPECT_EQ(cut(specials, "<s><s>a</s>"), (Pieces{"#1", "#1", "a", "#2"}));
  EXPECT_EQ(cut(specials, "</s"), (Pieces{"</s"}));  // a prefix of a special is text
  EXPECT_EQ(cut(specials, "<unk>"), (Pieces{"#0"}));
  EXPECT_EQ(cut(specials, "plain text"), (Pieces{"plain text"}));
  EXPECT_TRUE(specials.split("").empty());
  EXPECT_FALSE(specials.empty());
}

TEST(SpecialTokens, NoSpecialsLeaveTheTextWhole) {
  const SpecialTokens none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(cut(none, "<s>x"), (Pieces{"<s>x"}));
  // Empty texts match nothing (a vocabulary may hold an empty control token).
  const SpecialTokens empty_text({{"", 7}});
  EXPECT_TRUE(empty_text.empty());
  EXPECT_EQ(cut(empty_text, "abc"), (Pieces{"abc"}));
}

TEST(SpecialTokens, TheLongestSpecialClaimsItsTextFirstWhereverItStarts) {
  // llama.cpp partitions by each special in turn, longest first: "bcd" takes its text before "ab" is looked
  // for, although "ab" starts further left.
  const SpecialTokens specials({{"ab", 1}, {"bcd", 2}});
  EXPECT_EQ(cut(specials, "abcd"), (Pieces{"a", "#2"}));
  EXPECT_EQ(cut(specials, "abab"), (Pieces{"#1", "#1"}));
  EXPECT_EQ(cut(specials, "abcdab"), (Pieces{"a", "#2", "#1"}));
  // A longer special that starts with a shorter one wins at the same place.
  const SpecialTokens nested({{"<|e|>", 5}, {"<|eot|>", 6}});
  EXPECT_EQ(cut(nested, "x<|eot|>y<|e|>"), (Pieces{"x", "#6", "y", "#5"}));
  // Occurrences of one special do not overlap: taken from the left.
  const SpecialTokens repeated({{"aa", 3}});
  EXPECT_EQ(cut(repeated, "aaa"), (Pieces{"#3", "a"}));
  // Equal lengths in the order given.
  const SpecialTokens tie({{"xy", 8}, {"yz", 9}});
  EXPECT_EQ(cut(tie, "xyz"), (Pieces{"#8", "z"}));
  const SpecialTokens tie_reversed({{"yz", 9}, {"xy", 8}});
  EXPECT_EQ(cut(tie_reversed, "xyz"), (Pieces{"x", "#9"}));
}

TEST(SpecialTokens, MultiByteTextsMatchAsBytes) {
  const SpecialTokens specials({{"<｜end▁of▁sentence｜>", 4}, {"▁", 5}});
  EXPECT_EQ(cut(specials, "é<｜end▁of▁sentence｜>▁x"), (Pieces{"é", "#4", "#5", "x"}));
}

}  // namespace
}  // namespace shardline::runtime
