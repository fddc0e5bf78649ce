// The llama2.c BPE tokenizer (run.c's encode/decode), so prompts tokenize to exactly the ids upstream feeds
// its model and the goldens in shared/models can be compared id for id.
//
// tokenizer.bin layout (little endian, what llama2.c's tokenizer.py writes):
//   int32 max_token_length
//   vocab_size times: float32 score, int32 len, len bytes (no NUL)
// The token count is not stored: it is the model's vocab_size. Fixed ids: 0 = <unk>, 1 = BOS ("\n<s>\n"),
// 2 = EOS ("\n</s>\n"), 3 + b = the byte-fallback token "<0xBB>" for byte b.
//
// Example with the Llama 2 vocabulary: encode("Once upon a time", bos=true, eos=false) = {1, 9038, 2501, 263,
// 931}: BOS, " Once", " upon", " a", " time" (the dummy prefix " " became the leading space of " Once").
//
// A GGUF file's SentencePiece vocabulary has the same pieces and ids, and is used as llama.cpp uses it
// (llama.cpp, not llama2.c, wrote the file): special tokens written in the prompt ("<s>", "</s>") become their
// ids (special_tokens.h), each stretch of text between them merged as above (a typed U+2581 taken for the
// space it is to llama.cpp, and a byte that is not UTF-8 grouped with as many bytes as it announces, as
// llama.cpp groups it), with the dummy prefix where llama.cpp adds it (first, and after a special token);
// BOS is added when the file asks for it (tokenizer.ggml.add_bos_token) and the text does not start with one
// (the one place this parts from llama.cpp, which adds a second and warns of it; the byte-level path does the
// same); generation ends at EOS (or EOT, EOM), not at BOS; control and unknown tokens print nothing. A file
// without token types has no special tokens.
//
// A GGUF file may instead carry Llama 3's byte-level BPE vocabulary (byte_level_bpe.h): then encode, decode
// and the special ids are that vocabulary's, and the llama2.c ids above do not apply. Its BOS is added when
// the file asks for it (tokenizer.ggml.add_bos_token) and the text does not start with BOS's own text.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardline::runtime {

class ByteLevelBpe;

inline constexpr int kUnkId = 0;
inline constexpr int kBosId = 1;
inline constexpr int kEosId = 2;
inline constexpr int kByteFallbackId = 3;  // byte b is token kByteFallbackId + b
inline constexpr int kMinVocabSize = kByteFallbackId + 256;
// U+2581, how SentencePiece (and a GGUF file's tokens) spell a space.
inline constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";
// text with each kSentencePieceSpace as " ": a GGUF file's token as llama2.c's tokenizer.bin spells it.
std::string sentencepiece_spaces_as_spaces(std::string_view text);

class Tokenizer {
 public:
  // Reads a llama2.c tokenizer.bin holding exactly vocab_size tokens, or the vocabulary of a GGUF file
  // (gguf_model.h: the same pieces, converted to llama2.c's conventions). Throws ResourceError when the file
  // cannot be opened, FormatError (naming the path) when it is truncated, has the wrong number of tokens,
  // negative lengths, NaN scores, or byte-fallback tokens where "<0x00>".."<0xFF>" should be.
  Tokenizer(const std::string& path, int vocab_size);
  // From in-memory pieces (synthetic vocabularies, tests). Same validation, FormatError on failure.
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores);

  int vocab_size() const;
  // The id encode() starts with when asked for BOS: kBosId, or a byte-level vocabulary's (-1: it adds none).
  int bos_id() const;

  // The ids after which generation stops (the token itself is not output): llama2.c's BOS (run.c stops when
  // the model starts a new sequence), or a GGUF vocabulary's EOS, EOT and EOM.
  const std::vector<int>& end_ids() const { return end_ids_; }
  // What end_ids() are, for a message: "BOS, llama2.c's end of text", or a GGUF vocabulary's end tokens by
  // their text ("an end-of-text token: '<|end_of_text|>' or '<|eot_id|>'").
  std::string end_description() const;
  // Whether `piece` (a decode() result) is written out: is_printable_piece for llama2.c's vocabulary; every
  // byte-level piece (a token may end inside a UTF-8 character that the next one completes).
  bool prints(std::string_view piece) const;
  // Whether this is a byte-level vocabulary (Llama 3's), whose pieces may end inside a UTF-8 character.
  bool is_byte_level() const { return byte_level_ != nullptr; }

  // run.c encode(): [BOS] + dummy prefix " " (if text is non-empty) + one token per UTF-8 codepoint (its
  // bytes as byte-fallback tokens when the codepoint is not a piece), then repeatedly merge the adjacent pair
  // whose concatenation is a piece with the highest score, leftmost on ties; + [EOS].
  // Same result as run.c's O(n^2) rescans, in O(n log n) (a heap of candidate pairs).
  // A GGUF vocabulary: llama.cpp's conventions (above) around the same merges.
  std::vector<int> encode(std::string_view text, bool bos, bool eos) const;

  // run.c decode(): the piece of `token`, minus its leading space right after BOS; "<0xBB>" becomes the raw
  // byte BB; "" for a GGUF vocabulary's control and unknown tokens. The view stays valid as long as this
  // Tokenizer (byte views point into static storage).
  std::string_view decode(int prev_token, int token) const;

  // run.c safe_printf(): false for a single-byte piece that is neither printable ASCII nor whitespace (a
  // lone UTF-8 fragment or control byte would garble a terminal). Multi-byte pieces and "" are printable.
  static bool is_printable_piece(std::string_view piece);

  // A byte-level vocabulary's piece is its token's spelling, its score 0, and lookup finds nothing.
  const std::string& piece(int id) const;
  float score(int id) const;
  // Lowest id whose piece is exactly `text`, or -1.
  int lookup(std::string_view text) const;

  // Writes the tokenizer.bin format above. Throws ResourceError when the file cannot be written, ConfigError
  // for a byte-level vocabulary (tokenizer.bin cannot hold its merges).
  void save(const std::string& path) const;

 private:
  // Transparent hashing so encode can look up a std::string_view without building a std::string.
  struct PieceHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  // Checks the fixed ids (byte tokens) and fills index_; `source` names the file in error messages.
  void build_index(const std::string& source);
  // Appends text's tokens: the dummy prefix when asked (and text is not empty), one token per codepoint,
  // then the merges among the tokens from `merge_from` on (run.c merges BOS too: it is in its token list).
  // A codepoint is a byte and the continuation bytes after it (run.c), or with by_lead_byte as many bytes as
  // its first byte announces, whatever they are (llama.cpp: the two differ only on text that is not UTF-8).
  void encode_run_c(std::string_view text, bool dummy_prefix, std::size_t merge_from, std::vector<int>& tokens,
                    bool by_lead_byte = false) const;
  // A GGUF vocabulary's token as the file spells it (a special token's own text; else its piece).
  const std::string& gguf_spelling(int id) const;

  std::vector<std::string> pieces_;  // (vocab_size); empty with a byte-level vocabulary
  std::vector<float> scores_;        // (vocab_size)
  std::shared_ptr<const ByteLevelBpe> byte_level_;  // a GGUF file's Llama 3 vocabulary, else null
  // A GGUF file's SentencePiece conventions (llama.cpp's), with its special tokens ready to split a prompt at;
  // null for tokenizer.bin and in-memory vocabularies (llama2.c's).
  struct GgufConventions;
  std::shared_ptr<const GgufConventions> gguf_;
  std::vector<int> end_ids_ = {kBosId};
  // Owns copies of the pieces (not views into pieces_) so the default copy and move stay correct.
  std::unordered_map<std::string, int, PieceHash, std::equal_to<>> index_;
};

// A deterministic vocabulary of exactly vocab_size tokens for synthetic models. Throws ConfigError when
// vocab_size < kMinVocabSize (259). Layout:
//   0..258  <unk>, BOS, EOS, "<0x00>".."<0xFF>"        (score 0, as in the Llama 2 file)
//   then    the 95 printable ASCII characters, " a".." z", and for lengths 2, 3, 4...: every string over
//           the alphabet "etaoinshrdlu" followed by the same with a leading space ("th", " th", ...)
// Scores fall by 1 per piece from -1, so shorter and earlier pieces merge first; every longer piece is its
// own prefix plus one character, so merges can reach it.
Tokenizer make_synthetic_tokenizer(int vocab_size);

}  // namespace shardline::runtime
