#include "runtime/tokenizer.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <queue>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/input_file.h"
#include "common/printable.h"
#include "runtime/byte_level_bpe.h"
#include "runtime/gguf.h"
#include "runtime/gguf_model.h"
#include "runtime/special_tokens.h"

namespace shardline::runtime {
namespace {

// tokenizer.bin is little endian and read with memcpy, as llama2.c does with fread.
static_assert(std::endian::native == std::endian::little, "tokenizer.bin reader assumes a little-endian host");

// run.c's merge loop starts from best_score = -1e10 and takes only strictly better scores, so a pair whose
// piece scores at or below this (or NaN) never merges. Llama 2's "  " (-1e9) still does.
constexpr float kNoMergeScore = -1e10f;

// Storage the byte-fallback decode views point into: kRawBytes[b] == b.
constexpr std::array<char, 256> kRawBytes = [] {
  std::array<char, 256> bytes{};
  for (int b = 0; b < 256; ++b) bytes[b] = static_cast<char>(b);
  return bytes;
}();

std::string byte_piece(int b) { return fmt::format("<0x{:02X}>", b); }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a "<0xBB>" piece stands for, else -1. run.c uses sscanf("<0x%02hhX>"), which is laxer about what
// follows the digits; in the Llama 2 vocabulary only the 256 byte tokens start with "<0x", so they agree.
int parse_byte_piece(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

bool is_continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// stdio rather than ifstream: libstdc++'s filebuf throws its own ios_failure on read errors (a directory).
std::string read_whole_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw ResourceError(fmt::format("cannot open tokenizer '{}': {}", path, std::strerror(errno)));
  std::string data;
  char chunk[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(chunk, 1, sizeof chunk, file.get())) > 0) data.append(chunk, n);
  if (std::ferror(file.get()))
    throw ResourceError(fmt::format("cannot read tokenizer '{}': {}", path, std::strerror(errno)));
  return data;
}

template <typename T>
bool read_pod(const std::string& data, std::size_t& pos, T& out) {
  if (data.size() - pos < sizeof(T)) return false;
  std::memcpy(&out, data.data() + pos, sizeof(T));
  pos += sizeof(T);
  return true;
}

}  // namespace

struct Tokenizer::GgufConventions {
  SentencePieceGguf file;  // as read (its specials spelled as the file spells them)
  SpecialTokens specials;  // file.specials, ready to split a prompt at
};

Tokenizer::Tokenizer(const std::string& path, int vocab_size) {
  require_input_file(path, "tokenizer", InputKind::kRegularFile);
  if (is_gguf_file(path)) {  // a GGUF model carries its vocabulary
    GgufVocabulary vocabulary = read_gguf_vocabulary(path, vocab_size);
    if (vocabulary.byte_level) {
      byte_level_ = std::make_shared<const ByteLevelBpe>(std::move(*vocabulary.byte_level),
                                                         fmt::format("the vocabulary of '{}'", path));
      end_ids_ = byte_level_->end_ids();
      return;
    }
    pieces_ = std::move(vocabulary.pieces);
    scores_ = std::move(vocabulary.scores);
    build_index(fmt::format("the vocabulary of '{}'", path));
    end_ids_ = vocabulary.sentencepiece->end_ids;
    SpecialTokens specials(vocabulary.sentencepiece->specials);
    gguf_ = std::make_shared<const GgufConventions>(
        GgufConventions{std::move(*vocabulary.sentencepiece), std::move(specials)});
    return;
  }
  const std::string data = read_whole_file(path);
  std::size_t pos = 0;
  std::int32_t max_token_length = 0;
  if (!read_pod(data, pos, max_token_length))
    throw FormatError(fmt::format("tokenizer '{}' is truncated: {} bytes, no max_token_length header", path,
                                  data.size()));
  if (max_token_length < 0)
    throw FormatError(fmt::format("tokenizer '{}' has a negative max_token_length {}", path, max_token_length));

  // Parse to the end of the file (not just vocab_size tokens) so a count mismatch can name both counts.
  while (pos < data.size()) {
    const std::size_t token_offset = pos;
    const int i = static_cast<int>(pieces_.size());
    float score = 0;
    std::int32_t len = 0;
    if (!read_pod(data, pos, score) || !read_pod(data, pos, len) ||
        (len >= 0 && data.size() - pos < static_cast<std::size_t>(len))) {
      if (i < vocab_size)
        throw FormatError(fmt::format("tokenizer '{}' ends inside token {} of {} (byte offset {}): the file is "
                                      "truncated, or the length of this or an earlier token is wrong",
                                      path, i, vocab_size, token_offset));
      throw FormatError(fmt::format("tokenizer '{}' has {} trailing bytes after token {}, but the model expects "
                                    "{} tokens",
                                    path, data.size() - token_offset, i - 1, vocab_size));
    }
    if (len < 0)
      throw FormatError(fmt::format("tokenizer '{}': token {} has a negative length {} (byte offset {})", path, i,
                                    len, token_offset));
    // As the GGUF vocabulary's scores: a merge score that is not a number is a corrupt file, not a token that
    // always (Inf) or never (NaN, -Inf) merges.
    if (!std::isfinite(score))
      throw FormatError(fmt::format("tokenizer '{}': token {} has the score {} (byte offset {}); scores are finite "
                                    "numbers (or an earlier token's length is wrong)",
                                    path, i, score, token_offset));
    pieces_.emplace_back(data.data() + pos, static_cast<std::size_t>(len));
    scores_.push_back(score);
    pos += static_cast<std::size_t>(len);
  }
  if (static_cast<int>(pieces_.size()) != vocab_size)
    throw FormatError(fmt::format("{}: tokenizer has {} tokens but the model expects {}; pass the tokenizer made "
                                  "with this model (--tokenizer), or copy it again if it is damaged",
                                  path, pieces_.size(), vocab_size));
  build_index(fmt::format("tokenizer '{}'", path));
}

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores)
    : pieces_(std::move(pieces)), scores_(std::move(scores)) {
  if (pieces_.size() != scores_.size())
    throw FormatError(fmt::format("in-memory vocabulary has {} pieces but {} scores", pieces_.size(),
                                  scores_.size()));
  build_index("in-memory vocabulary");
}

void Tokenizer::build_index(const std::string& source) {
  if (pieces_.size() < static_cast<std::size_t>(kMinVocabSize))
    throw FormatError(fmt::format("{} has {} tokens; a llama2.c vocabulary needs at least {} (<unk>, BOS, EOS "
                                  "and 256 byte tokens)",
                                  source, pieces_.size(), kMinVocabSize));
  // encode() orders merges by score: a NaN has no order (and would break the heap's).
  for (int id = 0; id < vocab_size(); ++id) {
    if (std::isnan(scores_[id])) throw FormatError(fmt::format("{}: token {} has a NaN score", source, id));
  }
  // encode() emits 3 + b for an unknown byte b and decode() must turn it back into b.
  for (int b = 0; b < 256; ++b) {
    if (pieces_[kByteFallbackId + b] != byte_piece(b))
      throw FormatError(fmt::format("{}: token {} is '{}' but the byte-fallback token '{}' belongs there", source,
                                    kByteFallbackId + b, printable(pieces_[kByteFallbackId + b]), byte_piece(b)));
  }
  index_.clear();
  index_.reserve(pieces_.size());
  for (int id = 0; id < vocab_size(); ++id) index_.emplace(pieces_[id], id);  // first id wins on duplicates
}

int Tokenizer::vocab_size() const {
  return byte_level_ ? byte_level_->vocab_size() : static_cast<int>(pieces_.size());
}

int Tokenizer::bos_id() const {
  if (byte_level_) return byte_level_->add_bos() ? byte_level_->bos_id() : -1;
  return !gguf_ || gguf_->file.add_bos ? kBosId : -1;
}

const std::string& Tokenizer::gguf_spelling(int id) const {
  for (const auto& [text, special] : gguf_->file.specials) {
    if (special == id) return text;  // "</s>", where pieces_ holds llama2.c's "\n</s>\n"
  }
  return piece(id);
}

std::string Tokenizer::end_description() const {
  if (!byte_level_ && !gguf_) return "BOS, llama2.c's end of text";
  std::vector<std::string> names;
  for (const int id : end_ids_) {
    const std::string& name = byte_level_ ? byte_level_->token_text(id) : gguf_spelling(id);
    names.push_back(fmt::format("'{}'", printable(name, 40)));
  }
  return fmt::format("an end-of-text token: {}", fmt::join(names, " or "));
}

bool Tokenizer::prints(std::string_view piece) const { return byte_level_ != nullptr || is_printable_piece(piece); }

int Tokenizer::lookup(std::string_view text) const {
  auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

const std::string& Tokenizer::piece(int id) const {
  SL_CHECK_MSG(id >= 0 && id < vocab_size(), "token id {} outside vocabulary of {}", id, vocab_size());
  return byte_level_ ? byte_level_->token_text(id) : pieces_[id];
}

float Tokenizer::score(int id) const {
  SL_CHECK_MSG(id >= 0 && id < vocab_size(), "token id {} outside vocabulary of {}", id, vocab_size());
  return byte_level_ ? 0.0f : scores_[id];
}

std::vector<int> Tokenizer::encode(std::string_view text, bool bos, bool eos) const {
  if (byte_level_) {  // its own BOS (when the file asks for one) and end of text
    std::vector<int> tokens;
    const std::vector<int> body = byte_level_->encode(text);
    // A prompt written as a chat template starts with "<|begin_of_text|>" already: one BOS, not two.
    if (bos && byte_level_->add_bos() && (body.empty() || body.front() != byte_level_->bos_id())) {
      tokens.push_back(byte_level_->bos_id());
    }
    tokens.insert(tokens.end(), body.begin(), body.end());
    if (eos && !end_ids_.empty()) tokens.push_back(end_ids_.front());
    return tokens;
  }
  std::vector<int> tokens;
  tokens.reserve(text.size() + 3);
  if (gguf_) {
    // llama.cpp: the special tokens first, then each stretch of text between them on its own, with the dummy
    // prefix at the start and after each special token (llama_tokenize's is_prev_special).
    const std::vector<SpecialTokens::Piece> pieces = gguf_->specials.split(text);
    // A prompt written with its own "<s>" gets one BOS, not two (llama.cpp adds a second, and warns of it).
    if (bos && gguf_->file.add_bos && (pieces.empty() || pieces.front().id != kBosId)) tokens.push_back(kBosId);
    bool after_special = true;
    for (const SpecialTokens::Piece& piece : pieces) {
      if (piece.id >= 0) {
        tokens.push_back(piece.id);
      } else {
        // llama.cpp writes the text's spaces as U+2581 before it merges, so one typed as U+2581 is a space
        // too (this vocabulary's pieces hold spaces where the file has U+2581).
        encode_run_c(sentencepiece_spaces_as_spaces(piece.text), gguf_->file.add_space_prefix && after_special,
                     tokens.size(), tokens, /*by_lead_byte=*/true);
      }
      after_special = piece.id >= 0;
    }
  } else {
    if (bos) tokens.push_back(kBosId);
    encode_run_c(text, true, 0, tokens);
  }
  if (eos) tokens.push_back(gguf_ ? end_ids_.front() : kEosId);
  return tokens;
}

void Tokenizer::encode_run_c(std::string_view text, bool dummy_prefix, std::size_t merge_from,
                             std::vector<int>& tokens, bool by_lead_byte) const {
  if (dummy_prefix && !text.empty()) {
    // sentencepiece's add_dummy_prefix. run.c pushes lookup(" ") unchecked (-1 if absent); the byte token
    // keeps a vocabulary without " " usable.
    const int space = lookup(" ");
    tokens.push_back(space >= 0 ? space : kByteFallbackId + ' ');
  }

  // One token per codepoint: a byte plus up to 3 following continuation bytes, grouped exactly as run.c does
  // (stray continuation bytes group the same way), or by its lead byte as llama.cpp's unicode_len_utf8 does.
  // run.c stops at a NUL; a string_view may hold one, which becomes the byte token 3.
  static constexpr std::size_t kLengthByHighBits[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  for (std::size_t i = 0; i < text.size();) {
    std::size_t len = 1;
    if (by_lead_byte) {
      len = std::min(kLengthByHighBits[static_cast<unsigned char>(text[i]) >> 4], text.size() - i);
    } else {
      while (len < 4 && i + len < text.size() && is_continuation_byte(text[i + len])) ++len;
    }
    const std::string_view cp = text.substr(i, len);
    if (const int id = lookup(cp); id >= 0) {
      tokens.push_back(id);
    } else {
      for (char c : cp) tokens.push_back(kByteFallbackId + static_cast<unsigned char>(c));
    }
    i += len;
  }

  // Merges, among tokens[merge_from..]. run.c rescans every adjacent pair per merge (O(n^2) lookups); this
  // keeps the pairs in a max-heap instead. Order is preserved by merging a node into its left neighbour, so
  // "leftmost in the current sequence" is "smallest node index", and the heap order (score desc, left asc)
  // picks the same pair as run.c's strict '>' scan. Entries go stale when either node changes; versions
  // detect that.
  std::vector<int> nodes(tokens.begin() + static_cast<std::ptrdiff_t>(merge_from), tokens.end());
  const int n = static_cast<int>(nodes.size());
  if (n > 1) {
    struct Candidate {
      float score;
      int left, right, id;
      unsigned left_version, right_version;
      bool operator<(const Candidate& o) const {  // "lower priority than"
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::vector<int> prev(n), next(n);  // (n) linked list over the surviving nodes, -1 at the ends
    std::vector<unsigned> version(n, 0);
    std::vector<bool> alive(n, true);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    std::priority_queue<Candidate> heap;
    std::string pair;
    auto push_pair = [&](int left, int right) {
      pair.assign(pieces_[nodes[left]]).append(pieces_[nodes[right]]);
      const int id = lookup(pair);
      if (id >= 0 && scores_[id] > kNoMergeScore)
        heap.push({scores_[id], left, right, id, version[left], version[right]});
    };
    for (int i = 0; i + 1 < n; ++i) push_pair(i, i + 1);

    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || version[c.left] != c.left_version ||
          version[c.right] != c.right_version)
        continue;
      nodes[c.left] = c.id;
      ++version[c.left];
      alive[c.right] = false;
      next[c.left] = next[c.right];
      if (next[c.left] >= 0) prev[next[c.left]] = c.left;
      if (prev[c.left] >= 0) push_pair(prev[c.left], c.left);
      if (next[c.left] >= 0) push_pair(c.left, next[c.left]);
    }
    // Node 0 is never a right-hand node, so the list starts there.
    std::vector<int> merged;
    merged.reserve(n);
    for (int i = 0; i >= 0; i = next[i]) merged.push_back(nodes[i]);
    tokens.resize(merge_from);
    tokens.insert(tokens.end(), merged.begin(), merged.end());
  }
}

std::string_view Tokenizer::decode(int prev_token, int token) const {
  if (byte_level_) return byte_level_->decode(token);
  if (gguf_ && !gguf_->file.silent.empty() && gguf_->file.silent.at(static_cast<std::size_t>(token))) return {};
  std::string_view p = piece(token);
  // sentencepiece's decoder drops the dummy prefix's space after BOS (llama2.c PR #89).
  if (prev_token == kBosId && !p.empty() && p.front() == ' ') p.remove_prefix(1);
  if (const int b = parse_byte_piece(p); b >= 0) return std::string_view(&kRawBytes[b], 1);
  return p;
}

bool Tokenizer::is_printable_piece(std::string_view piece) {
  if (piece.size() != 1) return true;
  // C-locale isprint || isspace, spelled out so a program's setlocale() cannot change the answer.
  const auto b = static_cast<unsigned char>(piece[0]);
  return (b >= 0x20 && b <= 0x7E) || (b >= '\t' && b <= '\r');
}

void Tokenizer::save(const std::string& path) const {
  if (byte_level_) throw ConfigError("a byte-level BPE vocabulary has no tokenizer.bin form (it needs its merges)");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw ResourceError(fmt::format("cannot create tokenizer '{}': {}", path, std::strerror(errno)));
  std::int32_t max_token_length = 0;
  for (const auto& p : pieces_) max_token_length = std::max<std::int32_t>(max_token_length, p.size());
  out.write(reinterpret_cast<const char*>(&max_token_length), sizeof max_token_length);
  for (int id = 0; id < vocab_size(); ++id) {
    const auto len = static_cast<std::int32_t>(pieces_[id].size());
    out.write(reinterpret_cast<const char*>(&scores_[id]), sizeof(float));
    out.write(reinterpret_cast<const char*>(&len), sizeof len);
    out.write(pieces_[id].data(), len);
  }
  out.close();
  if (!out) throw ResourceError(fmt::format("cannot write tokenizer '{}'", path));
}

std::string sentencepiece_spaces_as_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    if (text.substr(at).starts_with(kSentencePieceSpace)) {
      out += ' ';
      at += kSentencePieceSpace.size();
    } else {
      out += text[at++];
    }
  }
  return out;
}

Tokenizer make_synthetic_tokenizer(int vocab_size) {
  if (vocab_size < kMinVocabSize)
    throw ConfigError(fmt::format("synthetic vocab_size {} is too small: need at least {} (<unk>, BOS, EOS and "
                                  "256 byte tokens)",
                                  vocab_size, kMinVocabSize));
  const auto size = static_cast<std::size_t>(vocab_size);
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};  // as llama2.c's export spells them
  for (int b = 0; b < 256; ++b) pieces.push_back(byte_piece(b));
  std::vector<float> scores(pieces.size(), 0.0f);
  pieces.reserve(size);
  scores.reserve(size);
  auto add = [&](std::string p) {
    if (pieces.size() == size) return;
    pieces.push_back(std::move(p));
    scores.push_back(-static_cast<float>(pieces.size() - kMinVocabSize));  // -1, -2, ...
  };

  for (char c = 0x20; c <= 0x7E; ++c) add(std::string(1, c));
  for (char c = 'a'; c <= 'z'; ++c) add(std::string{' ', c});
  // Every string of length L over the alphabet, in odometer order, each followed by its " "-prefixed form.
  // Both have their (L-1)-long prefix from the previous round, so merges can build them.
  constexpr std::string_view kAlphabet = "etaoinshrdlu";
  for (std::size_t length = 2; pieces.size() < size; ++length) {
    std::vector<std::size_t> digits(length, 0);
    while (pieces.size() < size) {
      std::string word;
      for (std::size_t d : digits) word += kAlphabet[d];
      add(word);
      add(" " + word);
      std::size_t k = length;  // odometer increment, last digit fastest
      while (k > 0 && ++digits[k - 1] == kAlphabet.size()) digits[--k] = 0;
      if (k == 0) break;
    }
  }
  return Tokenizer(std::move(pieces), std::move(scores));
}

}  // namespace shardline::runtime
