#include "runtime/byte_level_bpe.h"

#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "runtime/tokenizer.h"
#include "tests/support/byte_level_vocab.h"
#include "tests/support/gguf_writer.h"

namespace shardline::runtime {
namespace {

using test::byte_level_spelled;

// The 256 byte tokens (ids 0..255, byte b is id b), then `extra` (given as bytes, stored spelled), with the
// merges given as "left right" of byte strings.
ByteLevelVocabulary hand_vocabulary(const std::vector<std::string>& extra,
                                    const std::vector<std::pair<std::string, std::string>>& merges = {}) {
  ByteLevelVocabulary v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_level_spelling(static_cast<unsigned char>(b)));
  for (const std::string& t : extra) v.tokens.push_back(byte_level_spelled(t));
  for (const auto& [l, r] : merges) v.merges.push_back(byte_level_spelled(l) + " " + byte_level_spelled(r));
  v.add_bos = false;
  return v;
}

int byte_id(char c) { return static_cast<unsigned char>(c); }

TEST(ByteLevelBpe, BytesAreSpelledAsGpt2Does) {
  // Printable bytes stand for themselves; the others take U+0100 on, in byte order: 0x00-0x20 are
  // U+0100-U+0120, 0x7F-0xA0 U+0121-U+0142, 0xAD U+0143.
  EXPECT_EQ(byte_level_spelling('a'), "a");
  EXPECT_EQ(byte_level_spelling('!'), "!");
  EXPECT_EQ(byte_level_spelling(0x00), "\xC4\x80");   // U+0100
  EXPECT_EQ(byte_level_spelling('\n'), "\xC4\x8A");   // U+010A "Ċ"
  EXPECT_EQ(byte_level_spelling(' '), "\xC4\xA0");    // U+0120 "Ġ"
  EXPECT_EQ(byte_level_spelling(0x7F), "\xC4\xA1");   // U+0121
  EXPECT_EQ(byte_level_spelling(0xA0), "\xC5\x82");   // U+0142
  EXPECT_EQ(byte_level_spelling(0xA1), "\xC2\xA1");   // "¡" itself
  EXPECT_EQ(byte_level_spelling(0xAD), "\xC5\x83");   // U+0143
  EXPECT_EQ(byte_level_spelling(0xFF), "\xC3\xBF");   // "ÿ" itself
}

TEST(ByteLevelBpe, MergesGoByRankThenLeftmost) {
  // "abcb" is no token: its bytes merge, lowest rank first. With "b c" first, "a b" is stale once b joined c,
  // and "a bc" makes "abc"; with "a b" first, "ab" and "c" have no merge.
  {
    const ByteLevelBpe bpe(hand_vocabulary({"bc", "ab", "abc"}, {{"b", "c"}, {"a", "b"}, {"a", "bc"}}), "test");
    EXPECT_EQ(bpe.encode("abcb"), (std::vector<int>{256 + 2, byte_id('b')}));
  }
  {
    const ByteLevelBpe bpe(hand_vocabulary({"bc", "ab", "abc"}, {{"a", "b"}, {"b", "c"}, {"a", "bc"}}), "test");
    EXPECT_EQ(bpe.encode("abcb"), (std::vector<int>{256 + 1, byte_id('c'), byte_id('b')}));
  }
  // Equal pairs: the leftmost merges first.
  const ByteLevelBpe aa(hand_vocabulary({"aa"}, {{"a", "a"}}), "test");
  EXPECT_EQ(aa.encode("aaa"), (std::vector<int>{256, byte_id('a')}));
  EXPECT_EQ(aa.encode("aaaa"), (std::vector<int>{256, 256}));
  // A piece that is a token is that token, merges or not (Llama 3 ignores merges for those).
  const ByteLevelBpe whole(hand_vocabulary({"xyz"}), "test");
  EXPECT_EQ(whole.encode("xyz"), (std::vector<int>{256}));
  EXPECT_EQ(whole.encode("xyzx"), (std::vector<int>{byte_id('x'), byte_id('y'), byte_id('z'), byte_id('x')}));
}

TEST(ByteLevelBpe, TextSplitsAsLlama3sPreTokenizerSplitsIt) {
  // Every piece Llama 3's regex cuts is a token here, so the ids spell out the cut: words with one leading
  // space or punctuation, contractions in any case, numbers in threes, punctuation runs with their newlines,
  // a space run's last space left to the word after it.
  const std::vector<std::string> pieces = {"I", "'m", " ", "123", "45", " apples", "!!\n\n", " x", "DON", "'T",
                                           "\xC3\xA9t\xC3\xA9", " \xE5\xA4\xA7", "...", "\n", "  "};
  const ByteLevelBpe bpe(hand_vocabulary(pieces), "test");
  auto id = [&](const std::string& piece) {  // a one-byte piece is its byte's token, the first so spelled
    if (piece.size() == 1) return byte_id(piece[0]);
    return 256 + static_cast<int>(std::find(pieces.begin(), pieces.end(), piece) - pieces.begin());
  };
  EXPECT_EQ(bpe.encode("I'm 12345 apples!!\n\n  x"),
            (std::vector<int>{id("I"), id("'m"), id(" "), id("123"), id("45"), id(" apples"), id("!!\n\n"), id(" "),
                              id(" x")}));
  EXPECT_EQ(bpe.encode("DON'T"), (std::vector<int>{id("DON"), id("'T")}));
  // Letters of any script: "été" one word, a CJK character with its space another.
  EXPECT_EQ(bpe.encode("\xC3\xA9t\xC3\xA9 \xE5\xA4\xA7..."),
            (std::vector<int>{id("\xC3\xA9t\xC3\xA9"), id(" \xE5\xA4\xA7"), id("...")}));
  // U+180E (Mongolian vowel separator) is no longer White_Space (Unicode 6.3): it joins the space before it as
  // punctuation does, where PCRE2's own \s took it for a space.
  const ByteLevelBpe mvs(hand_vocabulary({" \xE1\xA0\x8E"}), "test");
  EXPECT_EQ(mvs.encode("  \xE1\xA0\x8E"), (std::vector<int>{byte_id(' '), 256}));
  // Trailing spaces stay together at the end; a newline after spaces takes them.
  EXPECT_EQ(bpe.encode("x  "), (std::vector<int>{byte_id('x'), id("  ")}));
  EXPECT_EQ(bpe.encode("x\n"), (std::vector<int>{byte_id('x'), id("\n")}));
}

TEST(ByteLevelBpe, SpecialTokensInTheTextAreTheirIds) {
  const ByteLevelVocabulary v = test::make_byte_level_vocabulary(400);
  const ByteLevelBpe bpe(v, "test");
  const int bos = v.bos_id, eot = v.end_ids[1];
  EXPECT_EQ(bpe.encode("<|begin_of_text|>a<|eot_id|>b"),
            (std::vector<int>{bos, byte_id('a'), eot, byte_id('b')}));
  EXPECT_EQ(bpe.decode(eot), "");  // control tokens print nothing
  EXPECT_EQ(bpe.decode(bos), "");
  // A half-written special is text.
  const std::vector<int> half = bpe.encode("<|eot");
  EXPECT_EQ(std::find(half.begin(), half.end(), eot), half.end());
}

TEST(ByteLevelBpe, DecodingGivesBackTheText) {
  const ByteLevelBpe bpe(test::make_byte_level_vocabulary(500), "test");
  std::mt19937 rng(5);
  const std::vector<std::string> alphabet = {"a", "e", "t", " ", "  ", "\n", "\t", "The", " the", "'s", "1", "23",
                                             "!", "\"", "\xC3\xA9", "\xE5\xA4\xA7", "\xF0\x9F\x98\x80", "\r\n", "Lily"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    std::string back;
    for (const int id : bpe.encode(text)) back += bpe.decode(id);
    ASSERT_EQ(back, text);
  }
  // The corpus the merges came from takes fewer tokens than bytes.
  EXPECT_LT(bpe.encode(test::kByteLevelCorpus).size(), std::string(test::kByteLevelCorpus).size() / 2);
}

TEST(ByteLevelBpe, TextThatIsNotUtf8IsRefused) {
  const ByteLevelBpe bpe(hand_vocabulary({}), "test");
  for (const std::string& bad : {std::string("a\xFF"), std::string("\xC3"), std::string("\xED\xA0\x80"),
                                std::string("\xC0\xAF")}) {
    try {
      bpe.encode(bad);
      ADD_FAILURE() << "accepted " << ::testing::PrintToString(bad);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("not UTF-8"), std::string::npos) << e.what();
    }
  }
}

TEST(ByteLevelBpe, VocabulariesItCannotRunAreRefused) {
  auto error_of = [](ByteLevelVocabulary v) {
    try {
      ByteLevelBpe bpe(std::move(v), "the vocabulary of 'x.gguf'");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no FormatError");
  };
  ByteLevelVocabulary qwen = hand_vocabulary({});
  qwen.pre = "qwen2";
  EXPECT_NE(error_of(qwen).find("pre-tokenizer (tokenizer.ggml.pre) is 'qwen2'; shardline runs 'llama-bpe'"),
            std::string::npos);
  ByteLevelVocabulary no_byte = hand_vocabulary({});
  no_byte.tokens[0x41] = "A-not-a-byte";
  EXPECT_NE(error_of(no_byte).find("no token for byte 0x41"), std::string::npos) << error_of(no_byte);
  ByteLevelVocabulary merge = hand_vocabulary({"ab"});
  merge.merges = {"ab"};
  EXPECT_NE(error_of(merge).find("merge 0 ('ab') is not two tokens"), std::string::npos);
  ByteLevelVocabulary bos = hand_vocabulary({});
  bos.bos_id = 256;
  bos.add_bos = true;
  EXPECT_NE(error_of(bos).find("bos_token_id is 256 but the vocabulary has 256 tokens"), std::string::npos);
  ByteLevelVocabulary types = hand_vocabulary({});
  types.types = {1, 1};
  EXPECT_NE(error_of(types).find("token_type has 2 entries for 256 tokens"), std::string::npos);
  // A special token that is not UTF-8 would split a character of the prompt (and hand PCRE2 a fragment).
  ByteLevelVocabulary fragment = hand_vocabulary({"x"});
  fragment.tokens[256] = "\xC3";
  fragment.types.assign(257, 1);
  fragment.types[256] = static_cast<int>(TokenType::kControl);
  EXPECT_NE(error_of(fragment).find("special token 256 ('\\xc3') is not UTF-8 text"), std::string::npos)
      << error_of(fragment);
}

TEST(ByteLevelBpe, AGgufFilesByteLevelVocabularyIsTheTokenizers) {
  // Through Tokenizer, as run reads a model's own vocabulary: its BOS, its end ids, every piece printed.
  const std::string path = (std::filesystem::temp_directory_path() / "shardline_byte_level_vocab.gguf").string();
  const ByteLevelVocabulary v = test::make_byte_level_vocabulary(320);
  test::GgufWriter w;
  test::write_byte_level_vocabulary(w, v);
  w.write(path);
  const Tokenizer tokenizer(path, 320);
  std::filesystem::remove(path);
  EXPECT_EQ(tokenizer.vocab_size(), 320);
  EXPECT_EQ(tokenizer.bos_id(), 317);
  EXPECT_EQ(tokenizer.end_ids(), (std::vector<int>{318, 319}));
  const std::vector<int> ids = tokenizer.encode("Once upon", /*bos=*/true, /*eos=*/true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 317);
  EXPECT_EQ(ids.back(), 318);
  std::string text;
  for (std::size_t i = 1; i + 1 < ids.size(); ++i) text += tokenizer.decode(ids[i - 1], ids[i]);
  EXPECT_EQ(text, "Once upon");
  EXPECT_TRUE(tokenizer.prints("\xE5"));  // a token may end inside a character; the next completes it
  EXPECT_THROW(tokenizer.save(path), ConfigError);
}

TEST(ByteLevelBpe, TokenTypesOutsideLlamaCppsAreRefused) {
  // tokenizer.ggml.token_type holds 0 to 6; a NaN, a fraction or 7 is a damaged file (a NaN once reached an
  // int cast).
  const std::string path = (std::filesystem::temp_directory_path() / "shardline_byte_level_types.gguf").string();
  for (const float bad : {7.0f, -1.0f, 2.5f, std::numeric_limits<float>::quiet_NaN(), 1e30f}) {
    const ByteLevelVocabulary v = test::make_byte_level_vocabulary(300);
    test::GgufWriter w;
    w.string("tokenizer.ggml.model", "gpt2");
    w.string("tokenizer.ggml.pre", "llama-bpe");
    w.strings("tokenizer.ggml.tokens", v.tokens);
    std::vector<float> types(v.types.begin(), v.types.end());
    types[5] = bad;
    w.f32s("tokenizer.ggml.token_type", types);
    w.strings("tokenizer.ggml.merges", v.merges);
    w.write(path);
    try {
      const Tokenizer tokenizer(path, 300);
      ADD_FAILURE() << "accepted the type " << bad;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("token 5 has the type"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace shardline::runtime
