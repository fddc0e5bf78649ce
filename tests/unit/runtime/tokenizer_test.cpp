#include "runtime/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/text_stream.h"

namespace shardline::runtime {
namespace {

namespace fs = std::filesystem;

#ifndef SHARDLINE_SOURCE_DIR
#error "tests need SHARDLINE_SOURCE_DIR (the repository root) to find ../shared/models"
#endif

fs::path models_dir() {
  if (const char* dir = std::getenv("SHARDLINE_MODELS_DIR"); dir && *dir) return dir;
  return fs::path(SHARDLINE_SOURCE_DIR) / ".." / "shared" / "models";
}

bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

// Reference data is not in the repository: skip locally, fail in CI (shared/models/README.md).
#define REQUIRE_FILE(path)                                                              \
  do {                                                                                  \
    if (!fs::exists(path)) {                                                            \
      if (in_ci()) FAIL() << "missing reference file " << (path);                      \
      GTEST_SKIP() << "missing reference file " << (path) << " (set SHARDLINE_MODELS_DIR)"; \
    }                                                                                   \
  } while (0)

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

fs::path write_temp(const std::string& name, const std::string& bytes) {
  const fs::path path = fs::path(::testing::TempDir()) / ("shardline_tokenizer_test_" + name);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return path;
}

// The FormatError a tokenizer file of vocab_size tokens gets, or "no FormatError".
std::string format_error_of(const fs::path& file, int vocab_size) {
  try {
    Tokenizer(file.string(), vocab_size);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "no FormatError";
}

// What the caller prints for a sequence that starts with BOS, as run.c's generate loop does.
std::string decode_all(const Tokenizer& tok, const std::vector<int>& ids) {
  std::string text;
  for (std::size_t i = 1; i < ids.size(); ++i) text += tok.decode(ids[i - 1], ids[i]);
  return text;
}

// run.c encode() transcribed line by line (linear rescans, strict '>' from -1e10), to check the heap version.
std::vector<int> run_c_encode(const Tokenizer& t, const std::string& text, bool bos, bool eos) {
  std::vector<int> tokens;
  if (bos) tokens.push_back(1);
  if (!text.empty()) tokens.push_back(t.lookup(" "));
  std::string buf;
  for (std::size_t c = 0; c < text.size(); ++c) {
    if ((static_cast<unsigned char>(text[c]) & 0xC0) != 0x80) buf.clear();
    buf += text[c];
    const bool next_cont = c + 1 < text.size() && (static_cast<unsigned char>(text[c + 1]) & 0xC0) == 0x80;
    if (next_cont && buf.size() < 4) continue;
    if (int id = t.lookup(buf); id != -1) {
      tokens.push_back(id);
    } else {
      for (char b : buf) tokens.push_back(static_cast<unsigned char>(b) + 3);
    }
    buf.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int best_id = -1, best_idx = -1;
    for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int id = t.lookup(t.piece(tokens[i]) + t.piece(tokens[i + 1]));
      if (id != -1 && t.score(id) > best_score) {
        best_score = t.score(id);
        best_id = id;
        best_idx = static_cast<int>(i);
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  if (eos) tokens.push_back(2);
  return tokens;
}

// A random mix of ASCII words, whitespace, Cyrillic, CJK, emoji and stray bytes.
std::string random_text(std::mt19937& rng, int n_parts) {
  static const std::vector<std::string> parts = {
      "the", " the", "a", " ", "  ", "\n", "\t", "cluster", "node", "s", "ing", "Once", " upon", "!", ",",
      "12", "3", "привет", "мир", "世界", "日本", "🦙", "🚀", "é", "\xff", "\x80", "<0x41>", "<s>", "x"};
  std::uniform_int_distribution<std::size_t> pick(0, parts.size() - 1);
  std::string text;
  for (int i = 0; i < n_parts; ++i) text += parts[pick(rng)];
  return text;
}

// The real Llama 2 vocabulary, loaded once for the whole suite.
class LlamaTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_FILE(path());
    if (!tok_) tok_ = std::make_unique<Tokenizer>(path().string(), 32000);
  }
  static fs::path path() { return models_dir() / "tokenizer.bin"; }
  const Tokenizer& tok() const { return *tok_; }

 private:
  static inline std::unique_ptr<Tokenizer> tok_;
};

TEST_F(LlamaTokenizerTest, FixedIds) {
  EXPECT_EQ(tok().vocab_size(), 32000);
  EXPECT_EQ(tok().piece(kBosId), "\n<s>\n");
  EXPECT_EQ(tok().piece(kEosId), "\n</s>\n");
  EXPECT_EQ(tok().piece(kByteFallbackId), "<0x00>");
  EXPECT_EQ(tok().piece(258), "<0xFF>");
  EXPECT_EQ(tok().lookup(" "), 29871);
  EXPECT_EQ(tok().lookup("no such piece"), -1);
}

TEST_F(LlamaTokenizerTest, MatchesGoldenPromptIds) {
  const fs::path goldens = models_dir() / "goldens.jsonl";
  REQUIRE_FILE(goldens);
  std::ifstream in(goldens);
  std::string line;
  int n_lines = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const auto prompt = j.at("prompt").get<std::string>();
    const auto expected = j.at("prompt_ids").get<std::vector<int>>();
    EXPECT_EQ(tok().encode(prompt, true, false), expected) << "prompt: " << prompt;
    ++n_lines;
  }
  EXPECT_GT(n_lines, 0);
}

TEST_F(LlamaTokenizerTest, BosEosAndEmptyText) {
  EXPECT_EQ(tok().encode("", true, false), (std::vector<int>{kBosId}));
  EXPECT_EQ(tok().encode("", false, false), std::vector<int>{});
  EXPECT_EQ(tok().encode("", true, true), (std::vector<int>{kBosId, kEosId}));
  EXPECT_EQ(tok().encode("Once upon a time", false, true), (std::vector<int>{9038, 2501, 263, 931, kEosId}));
}

// What a sequence's text shows (runtime/text_stream.h): byte tokens that spell a UTF-8 character are written
// as it, once complete; run.c printed none of them.
std::string text_of(const Tokenizer& tok, const std::vector<int>& ids) {
  TextStream text(tok);
  std::string out;
  for (std::size_t i = 1; i < ids.size(); ++i) out += text.add(tok.decode(ids[i - 1], ids[i]));  // BOS: no text
  return out;
}

TEST_F(LlamaTokenizerTest, TextJoinsByteTokensIntoTheCharactersTheySpell) {
  for (const std::string text : {"café 🦙 中文 ok", "a\u2029b", "🦙🦙"}) {
    const std::vector<int> ids = tok().encode(text, true, false);
    ASSERT_EQ(ids[0], kBosId);
    EXPECT_GT(std::count_if(ids.begin(), ids.end(), [](int id) { return id >= 3 + 0x80 && id <= 258; }), 0)
        << text << ": no byte tokens to join";
    EXPECT_EQ(text_of(tok(), ids), text);
  }
  EXPECT_EQ(text_of(tok(), tok().encode("Ünïcödé", true, false)), "Ünïcödé");  // whole pieces, as run.c
}

TEST_F(LlamaTokenizerTest, TextDropsBytesThatSpellNoCharacterOrAControl) {
  const auto bytes = [](std::initializer_list<int> values) {
    std::vector<int> ids = {kBosId};
    for (int b : values) ids.push_back(3 + b);
    return ids;
  };
  const int a = tok().lookup("A");
  ASSERT_GT(a, 258);
  std::vector<int> cut = bytes({0xE4});  // a character cut short by a piece
  cut.push_back(a);
  EXPECT_EQ(text_of(tok(), cut), "A");
  EXPECT_EQ(text_of(tok(), bytes({0xB8})), "");                          // a stray continuation byte
  EXPECT_EQ(text_of(tok(), bytes({0xE4, 0xB8, 0xE4, 0xB8, 0xAD})), "中");  // cut short by the next lead byte
  EXPECT_EQ(text_of(tok(), bytes({0xE4, 0xB8})), "");                    // never completed
  EXPECT_EQ(text_of(tok(), bytes({0xE0, 0x80, 0x80})), "");              // overlong
  EXPECT_EQ(text_of(tok(), bytes({0xED, 0xA0, 0x80})), "");              // a surrogate
  EXPECT_EQ(text_of(tok(), bytes({0xC0, 0x80, 0xF5, 0x80})), "");        // never lead bytes
  EXPECT_EQ(text_of(tok(), bytes({0xC2, 0x85})), "");                    // C1 control (NEL)
  EXPECT_EQ(text_of(tok(), bytes({0xE2, 0x80, 0xAE})), "");              // bidi override
  EXPECT_EQ(text_of(tok(), bytes({0x41, 0x07, 0x0A})), "A\n");           // ASCII byte tokens as run.c prints them
  EXPECT_EQ(text_of(tok(), bytes({0xF0, 0x9F, 0xA6, 0x99, 0x41})), "🦙A");
  EXPECT_EQ(text_of(tok(), bytes({0xF4, 0x90, 0x80, 0x80})), "");        // past U+10FFFF
  EXPECT_EQ(text_of(tok(), bytes({0xF0, 0x80, 0x80, 0x80})), "");        // overlong, 4 bytes
  EXPECT_EQ(text_of(tok(), bytes({0xE4, 0x41, 0xB8, 0xAD})), "A");       // an ASCII byte token cuts it short
  EXPECT_EQ(text_of(tok(), bytes({0xC3, 0xA9, 0xA9})), "é");             // a continuation after a whole character
}

TEST_F(LlamaTokenizerTest, TheGeneratedTextHoldsNoByteThePromptLeftIncomplete) {
  TextStream text(tok());
  EXPECT_EQ(text.add(tok().decode(kBosId, 3 + 0xE4)), "");  // the prompt ends inside a character
  text.end_prompt();
  EXPECT_EQ(text.add(tok().decode(3 + 0xE4, 3 + 0xB8)), "");
  EXPECT_EQ(text.add(tok().decode(3 + 0xB8, 3 + 0xAD)), "");  // not 中 from a byte the model never generated
  EXPECT_EQ(text.add(tok().decode(3 + 0xAD, 3 + 0xC3)), "");
  EXPECT_EQ(text.add(tok().decode(3 + 0xC3, 3 + 0xA9)), "é");
}

TEST_F(LlamaTokenizerTest, EmojiFallsBackToBytes) {
  // U+1F999 is not a piece: dummy prefix " ", then its four UTF-8 bytes as byte tokens.
  const std::vector<int> ids = tok().encode("🦙", false, false);
  EXPECT_EQ(ids, (std::vector<int>{29871, 3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99}));
  std::string bytes;
  for (std::size_t i = 1; i < ids.size(); ++i) {
    const std::string_view piece = tok().decode(ids[i - 1], ids[i]);
    EXPECT_FALSE(Tokenizer::is_printable_piece(piece));  // run.c would not print the fragments
    bytes += piece;
  }
  EXPECT_EQ(bytes, "🦙");
}

TEST_F(LlamaTokenizerTest, ByteTokensDecodeToRawBytes) {
  for (int b = 0; b < 256; ++b) {
    const std::string_view piece = tok().decode(kBosId, kByteFallbackId + b);  // no space to strip
    ASSERT_EQ(piece.size(), 1u) << b;
    EXPECT_EQ(static_cast<unsigned char>(piece[0]), b);
  }
}

TEST_F(LlamaTokenizerTest, DecodeStripsSpaceOnlyAfterBos) {
  const int once = tok().lookup(" Once");
  ASSERT_GE(once, 0);
  EXPECT_EQ(tok().decode(kBosId, once), "Once");
  EXPECT_EQ(tok().decode(263, once), " Once");
}

TEST_F(LlamaTokenizerTest, RoundTrips) {
  const std::vector<std::string> texts = {
      "",
      "Hello world",
      "привет 世界",
      "🦙",
      "llama 🦙🚀 emoji",
      "line one\nline two\n\n",
      "  two leading spaces",
      "tabs\tand\r\nCRLF",
      "invalid \xff\xfe utf-8 \x80",
      "Pipeline parallel inference splits layers across ranks",
      "<0x41> <s> </s> <unk>"};
  for (const auto& text : texts) {
    const std::vector<int> ids = tok().encode(text, true, false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), kBosId);
    EXPECT_EQ(decode_all(tok(), ids), text) << "text: " << text;
  }
}

TEST_F(LlamaTokenizerTest, MatchesRunCOnRandomText) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 1000; ++i) {
    const std::string text = random_text(rng, 1 + i % 40);
    ASSERT_EQ(tok().encode(text, true, false), run_c_encode(tok(), text, true, false)) << "text: " << text;
  }
  std::string long_text;
  while (long_text.size() < 1500) long_text += random_text(rng, 20);
  EXPECT_EQ(tok().encode(long_text, true, false), run_c_encode(tok(), long_text, true, false));
}

TEST_F(LlamaTokenizerTest, LongPromptRoundTrips) {
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < 5000) text += random_text(rng, 50);
  const std::vector<int> ids = tok().encode(text, true, true);
  EXPECT_EQ(ids.back(), kEosId);
  EXPECT_EQ(decode_all(tok(), std::vector<int>(ids.begin(), ids.end() - 1)), text);
}

TEST(TokenizerTest, IsPrintablePiece) {
  EXPECT_TRUE(Tokenizer::is_printable_piece("a"));
  EXPECT_TRUE(Tokenizer::is_printable_piece("~"));
  EXPECT_TRUE(Tokenizer::is_printable_piece(" "));
  EXPECT_TRUE(Tokenizer::is_printable_piece("\n"));
  EXPECT_TRUE(Tokenizer::is_printable_piece("\t"));
  EXPECT_TRUE(Tokenizer::is_printable_piece("\r"));
  EXPECT_FALSE(Tokenizer::is_printable_piece(std::string_view("\0", 1)));
  EXPECT_FALSE(Tokenizer::is_printable_piece("\x01"));
  EXPECT_FALSE(Tokenizer::is_printable_piece("\x7f"));
  EXPECT_FALSE(Tokenizer::is_printable_piece("\xf0"));
  // Only single bytes are filtered: whole UTF-8 characters and longer pieces print.
  EXPECT_TRUE(Tokenizer::is_printable_piece("\xd0\xbf"));
  EXPECT_TRUE(Tokenizer::is_printable_piece("ab"));
  EXPECT_TRUE(Tokenizer::is_printable_piece(""));
}

// specials + byte tokens + `extra` pieces with their scores.
Tokenizer small_vocab(const std::vector<std::pair<std::string, float>>& extra) {
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    pieces.push_back(name);
  }
  std::vector<float> scores(pieces.size(), 0.0f);
  for (const auto& [p, s] : extra) {
    pieces.push_back(p);
    scores.push_back(s);
  }
  return Tokenizer(std::move(pieces), std::move(scores));
}

TEST(TokenizerTest, TiesMergeLeftmostPairFirst) {
  // ids: " "=259 a=260 b=261 c=262 ab=263 bc=264
  Tokenizer tie = small_vocab({{" ", -1}, {"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -5}});
  EXPECT_EQ(tie.encode("abc", false, false), (std::vector<int>{259, 263, 262}));
  Tokenizer right_better = small_vocab({{" ", -1}, {"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -4}});
  EXPECT_EQ(right_better.encode("abc", false, false), (std::vector<int>{259, 260, 264}));
}

TEST(TokenizerTest, ScoresAtOrBelowRunCFloorNeverMerge) {
  Tokenizer t = small_vocab({{" ", -1}, {"a", -1}, {"b", -1}, {"ab", -1e10f}});
  EXPECT_EQ(t.encode("ab", false, false), (std::vector<int>{259, 260, 261}));
}

TEST(TokenizerTest, InMemoryVocabularyIsValidated) {
  EXPECT_THROW(Tokenizer(std::vector<std::string>(300, "x"), std::vector<float>(299)), FormatError);
  EXPECT_THROW(Tokenizer(std::vector<std::string>(10, "x"), std::vector<float>(10)), FormatError);
  const Tokenizer synthetic = make_synthetic_tokenizer(300);
  std::vector<std::string> pieces;
  for (int id = 0; id < 300; ++id) pieces.push_back(synthetic.piece(id));
  std::swap(pieces[3 + 'A'], pieces[3 + 'B']);  // byte tokens out of place
  EXPECT_THROW(Tokenizer(pieces, std::vector<float>(300)), FormatError);
  std::swap(pieces[3 + 'A'], pieces[3 + 'B']);
  std::vector<float> scores(300);
  scores[280] = std::numeric_limits<float>::quiet_NaN();  // merges are ordered by score: a NaN has no place
  try {
    Tokenizer(pieces, scores);
    FAIL() << "a NaN score was accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("token 280 has a NaN score"), std::string::npos) << e.what();
  }
}

// ---- file errors -----------------------------------------------------------------------------------------

TEST(TokenizerFileTest, MissingFileIsResourceError) {
  EXPECT_THROW(Tokenizer("/nonexistent/dir/tokenizer.bin", 32000), ResourceError);
  EXPECT_THROW(Tokenizer(::testing::TempDir(), 32000), ResourceError);  // a directory opens but cannot be read
}

TEST_F(LlamaTokenizerTest, TruncatedFileIsFormatError) {
  const std::string bytes = read_bytes(path());
  for (std::size_t n : {std::size_t{0}, std::size_t{2}, std::size_t{4}, std::size_t{10}, bytes.size() / 2,
                        bytes.size() - 1}) {
    const fs::path cut = write_temp("truncated.bin", bytes.substr(0, n));
    try {
      Tokenizer(cut.string(), 32000);
      ADD_FAILURE() << "no error for the first " << n << " bytes";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(cut.string()), std::string::npos) << e.what();
    }
  }
}

// Token 27237 of Llama 2's tokenizer.bin: its int32 length at this byte, its float score just before.
constexpr std::size_t kToken27237Length = 372961;

// A token's length one too large shifts every later token; the reader cannot tell that from a cut file, so
// it says both (from a fuzzing pass: it said only "truncated", of a file with every byte there).
TEST_F(LlamaTokenizerTest, AWrongTokenLengthIsNotCalledATruncation) {
  std::string bytes = read_bytes(path());
  ASSERT_EQ(bytes[kToken27237Length], 4);
  bytes[kToken27237Length] = 5;
  const std::string error = format_error_of(write_temp("long-token.bin", bytes), 32000);
  EXPECT_NE(error.find("ends inside token 27238 of 32000"), std::string::npos) << error;
  EXPECT_NE(error.find("the length of this or an earlier token is wrong"), std::string::npos) << error;
}

// Scores that are not numbers are refused by name, as the GGUF vocabulary's are (the .bin reader once took
// them: an Inf score made a token that always merges).
TEST_F(LlamaTokenizerTest, AScoreThatIsNotANumberIsAFormatError) {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::string bytes = read_bytes(path());
    std::memcpy(bytes.data() + kToken27237Length - sizeof(float), &bad, sizeof(bad));
    const std::string error = format_error_of(write_temp("bad-score.bin", bytes), 32000);
    EXPECT_NE(error.find("token 27237 has the score"), std::string::npos) << "score " << bad << ": " << error;
  }
}

TEST_F(LlamaTokenizerTest, VocabSizeMismatchIsFormatError) {
  for (int expected : {31999, 32001}) {
    try {
      Tokenizer(path().string(), expected);
      ADD_FAILURE() << "no error for vocab_size " << expected;
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path().string()), std::string::npos) << msg;
      EXPECT_NE(msg.find("tokenizer has 32000 tokens but the model expects " + std::to_string(expected)),
                std::string::npos)
          << msg;
    }
  }
  const fs::path padded = write_temp("trailing.bin", read_bytes(path()) + "xyz");
  EXPECT_THROW(Tokenizer(padded.string(), 32000), FormatError);
}

TEST(TokenizerFileTest, NegativeLengthIsFormatError) {
  const fs::path good = fs::path(::testing::TempDir()) / "shardline_tokenizer_test_negative_src.bin";
  make_synthetic_tokenizer(300).save(good.string());
  std::string bytes = read_bytes(good);
  const std::int32_t negative = -5;
  std::memcpy(&bytes[4 + 4], &negative, sizeof negative);  // token 0: after the header and its score
  const std::string error = format_error_of(write_temp("negative.bin", bytes), 300);
  EXPECT_NE(error.find("negative length"), std::string::npos) << error;
}

// ---- synthetic vocabulary ---------------------------------------------------------------------------------

TEST(SyntheticTokenizerTest, ExactSizeUniqueAndReachable) {
  for (int size : {259, 260, 300, 512, 4096, 32000}) {
    const Tokenizer tok = make_synthetic_tokenizer(size);
    ASSERT_EQ(tok.vocab_size(), size);
    std::set<std::string> seen;
    for (int id = 0; id < size; ++id) {
      const std::string& p = tok.piece(id);
      EXPECT_TRUE(seen.insert(p).second) << "duplicate piece '" << p << "' at " << id;
      EXPECT_EQ(tok.lookup(p), id);
      if (id >= kMinVocabSize) {
        if (id > kMinVocabSize) {
          EXPECT_LT(tok.score(id), tok.score(id - 1)) << id;
        }
        if (p.size() > 1) {
          EXPECT_GE(tok.lookup(p.substr(0, p.size() - 1)), 0) << "prefix of '" << p << "'";
        }
      }
    }
  }
}

TEST(SyntheticTokenizerTest, Deterministic) {
  const Tokenizer a = make_synthetic_tokenizer(5000), b = make_synthetic_tokenizer(5000);
  for (int id = 0; id < 5000; ++id) {
    ASSERT_EQ(a.piece(id), b.piece(id));
    ASSERT_EQ(a.score(id), b.score(id));
  }
}

TEST(SyntheticTokenizerTest, SaveLoadRoundTrip) {
  const Tokenizer tok = make_synthetic_tokenizer(1000);
  const fs::path path = fs::path(::testing::TempDir()) / "shardline_tokenizer_test_synthetic.bin";
  tok.save(path.string());
  const Tokenizer loaded(path.string(), 1000);
  ASSERT_EQ(loaded.vocab_size(), 1000);
  for (int id = 0; id < 1000; ++id) {
    EXPECT_EQ(loaded.piece(id), tok.piece(id));
    EXPECT_EQ(loaded.score(id), tok.score(id));
  }
  EXPECT_THROW(Tokenizer(path.string(), 999), FormatError);
}

TEST(SyntheticTokenizerTest, EncodeDecodeRoundTripAndMatchesRunC) {
  std::mt19937 rng(99);
  for (int size : {260, 512, 4096, 32000}) {
    const Tokenizer tok = make_synthetic_tokenizer(size);
    for (const std::string text : {"the shard line runs", "Hello, World! 123\n\tdone", "  a  b  ", "x"}) {
      const std::vector<int> ids = tok.encode(text, true, false);
      EXPECT_EQ(decode_all(tok, ids), text) << "size " << size << " text: " << text;
      EXPECT_EQ(ids, run_c_encode(tok, text, true, false));
    }
    for (int i = 0; i < 50; ++i) {
      const std::string text = random_text(rng, 1 + i % 20);
      ASSERT_EQ(tok.encode(text, true, false), run_c_encode(tok, text, true, false)) << text;
      ASSERT_EQ(decode_all(tok, tok.encode(text, true, false)), text) << text;
    }
  }
  // Larger vocabularies merge common text into fewer tokens.
  const std::string text = "the other one is in there";
  EXPECT_LT(make_synthetic_tokenizer(32000).encode(text, false, false).size(),
            make_synthetic_tokenizer(400).encode(text, false, false).size());
}

TEST(SyntheticTokenizerTest, SmallestVocabularyUsesOnlyByteTokens) {
  const Tokenizer tok = make_synthetic_tokenizer(kMinVocabSize);
  for (int id : tok.encode("hi there", false, false)) {
    EXPECT_GE(id, kByteFallbackId);
    EXPECT_LT(id, kMinVocabSize);
  }
}

TEST(SyntheticTokenizerTest, TooSmallIsConfigError) {
  EXPECT_THROW(make_synthetic_tokenizer(258), ConfigError);
  EXPECT_THROW(make_synthetic_tokenizer(0), ConfigError);
  EXPECT_THROW(make_synthetic_tokenizer(-1), ConfigError);
}

}  // namespace
}  // namespace shardline::runtime
