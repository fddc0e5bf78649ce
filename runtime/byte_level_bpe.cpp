#include "runtime/byte_level_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <queue>

#include <fmt/format.h>

#include "common/error.h"
#include "common/printable.h"

namespace shardline::runtime {
namespace {

// Unicode's White_Space characters, which \s means to Hugging Face's tokenizers, Python's regex and llama.cpp.
// Not PCRE2's \s: its list still holds U+180E, which Unicode 6.3 took out of White_Space (a helper's review
// against an independent reference found "  U+180E" split differently because of it).
#define SHARDLINE_WHITE_SPACE "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

// Llama 3's pre-tokenizer, as its tokenizer.json writes it with \s spelled out as above, \S as its negation
// (llama.cpp spells the (?i:...) group out by hand because its own regex engine lacks it; PCRE2 has it).
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" SHARDLINE_WHITE_SPACE
    "\\p{L}\\p{N}]+[\\r\\n]*|[" SHARDLINE_WHITE_SPACE "]*[\\r\\n]+|[" SHARDLINE_WHITE_SPACE
    "]+(?![^" SHARDLINE_WHITE_SPACE "])|[" SHARDLINE_WHITE_SPACE "]+";
#undef SHARDLINE_WHITE_SPACE

std::string utf8_of(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode(): the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the
// other 68 take U+0100, U+0101, ... in byte order.
const std::array<std::string, 256>& spellings() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    std::uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = utf8_of(printable ? static_cast<std::uint32_t>(b) : next++);
    }
    return t;
  }();
  return table;
}

// The length of the UTF-8 character starting at text[i] (1 to 4 bytes), or 0 when the bytes there are not one.
std::size_t utf8_length_at(std::string_view text, std::size_t i) {
  return static_cast<unsigned char>(text[i]) < 0x80 ? 1 : utf8_sequence_bytes(text, i);
}

// The offset of the first byte that does not begin a UTF-8 character, or npos when all of text is UTF-8.
std::size_t first_non_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_length_at(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

bool is_utf8(std::string_view text) { return first_non_utf8(text) == std::string_view::npos; }

void require_utf8(std::string_view text) {
  if (const std::size_t i = first_non_utf8(text); i != std::string_view::npos) {
    throw ConfigError(fmt::format("the prompt is not UTF-8 text (byte {} is 0x{:02X}); this model's vocabulary (byte-level "
                                  "BPE) tokenizes UTF-8 only",
                                  i, static_cast<unsigned char>(text[i])));
  }
}

// The byte a GPT-2 spelling's code point stands for (cp < 0x144), or -1.
int byte_of_code_point(std::uint32_t cp) {
  static const std::array<int, 0x144> table = [] {
    std::array<int, 0x144> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const std::string& s = spellings()[b];
      const auto c0 = static_cast<unsigned char>(s[0]);
      const std::uint32_t cp = s.size() == 1 ? c0 : ((c0 & 0x1F) << 6) | (static_cast<unsigned char>(s[1]) & 0x3F);
      t[cp] = b;
    }
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// A token's bytes: each code point of its spelling back to its byte; a code point outside GPT-2's alphabet (or
// a malformed sequence) is kept as it is written.
std::string bytes_of_spelling(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_length_at(text, i);
    if (n == 0) {
      out += text[i++];
      continue;
    }
    std::uint32_t cp = static_cast<unsigned char>(text[i]);
    if (n == 2) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
    const int b = n <= 2 ? byte_of_code_point(cp) : -1;
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  return out;
}

}  // namespace

const std::string& byte_level_spelling(unsigned char b) { return spellings()[b]; }

struct ByteLevelBpe::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

ByteLevelBpe::~ByteLevelBpe() = default;

ByteLevelBpe::ByteLevelBpe(ByteLevelVocabulary v, const std::string& source)
    : tokens_(std::move(v.tokens)), bos_id_(v.bos_id), add_bos_(v.add_bos), end_ids_(std::move(v.end_ids)) {
  auto refuse = [&](const std::string& why) { throw FormatError(fmt::format("{}: {}", source, why)); };
  if (v.pre != "llama-bpe") {
    refuse(fmt::format("its byte-level BPE pre-tokenizer (tokenizer.ggml.pre) is '{}'; shardline runs 'llama-bpe' "
                       "(Llama 3)",
                       printable(v.pre, 40)));
  }
  const int n = vocab_size();
  if (!v.types.empty() && v.types.size() != tokens_.size()) {
    refuse(fmt::format("tokenizer.ggml.token_type has {} entries for {} tokens", v.types.size(), tokens_.size()));
  }
  auto check_id = [&](int id, const char* what) {
    if (id < 0 || id >= n) refuse(fmt::format("{} is {} but the vocabulary has {} tokens", what, id, n));
  };
  if (bos_id_ >= 0 || add_bos_) check_id(bos_id_, "tokenizer.ggml.bos_token_id");
  for (const int id : end_ids_) check_id(id, "an end-of-text token id (eos, eot or eom)");

  decoded_.reserve(tokens_.size());
  std::vector<std::pair<std::string, int>> specials;
  for (int id = 0; id < n; ++id) {
    const auto type = v.types.empty() ? TokenType::kNormal : static_cast<TokenType>(v.types[id]);
    const std::string& text = tokens_[id];
    switch (type) {
      case TokenType::kControl:
      case TokenType::kUnknown:
      case TokenType::kUnused: decoded_.emplace_back(); break;
      case TokenType::kUserDefined: decoded_.push_back(text); break;  // written as plain text
      default: decoded_.push_back(bytes_of_spelling(text)); break;
    }
    if (is_special_token_type(type) && !text.empty()) {
      // Matched in UTF-8 text: one that is not UTF-8 would split a character, and leave PCRE2 a fragment.
      if (!is_utf8(text)) refuse(fmt::format("special token {} ('{}') is not UTF-8 text", id, printable(text, 40)));
      specials.emplace_back(text, id);
    }
    ids_.emplace(text, id);  // (emplace keeps the first of equal spellings)
  }
  specials_ = SpecialTokens(std::move(specials));
  for (int b = 0; b < 256; ++b) {
    if (!ids_.contains(spellings()[b])) {
      refuse(fmt::format("its vocabulary has no token for byte 0x{:02X} (spelled '{}'), which any text may hold", b,
                         spellings()[b]));
    }
  }
  merge_ranks_.reserve(v.merges.size());
  for (std::size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& merge = v.merges[rank];
    if (merge.find(' ', 1) == std::string::npos) {
      refuse(fmt::format("merge {} ('{}') is not two tokens separated by a space", rank, printable(merge, 40)));
    }
    merge_ranks_.emplace(merge, static_cast<int>(rank));
  }

  pre_ = std::make_unique<Regex>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  pre_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kLlama3Pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                             &error, &offset, nullptr);
  SL_CHECK(pre_->code != nullptr);  // a constant pattern: compiles or the build is broken
  pcre2_jit_compile(pre_->code, PCRE2_JIT_COMPLETE);  // where JIT is missing, matching interprets: same results
}

std::vector<int> ByteLevelBpe::encode(std::string_view text) const {
  require_utf8(text);
  std::vector<int> out;
  for (const SpecialTokens::Piece& piece : specials_.split(text)) {
    if (piece.id >= 0) {
      out.push_back(piece.id);
    } else {
      encode_plain(piece.text, out);
    }
  }
  return out;
}

void ByteLevelBpe::encode_plain(std::string_view text, std::vector<int>& out) const {
  if (text.empty()) return;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(pre_->code, nullptr), &pcre2_match_data_free);
  SL_CHECK(match != nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t at = 0;
  while (at < text.size()) {
    // The text is checked UTF-8 already (encode()), so PCRE2 need not check it again at every match.
    const int rc = pcre2_match(pre_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    SL_CHECK(rc > 0);
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match.get());
    std::size_t begin = span[0], end = span[1];
    if (begin > at) encode_piece(text.substr(at, begin - at), out);  // unmatched text: a piece of its own
    if (end == begin) end = begin + utf8_length_at(text, begin);     // (the pattern never matches empty)
    encode_piece(text.substr(begin, end - begin), out);
    at = end;
  }
  if (at < text.size()) encode_piece(text.substr(at), out);
}

void ByteLevelBpe::encode_piece(std::string_view piece, std::vector<int>& out) const {
  if (piece.empty()) return;
  std::string spelled;
  for (const char c : piece) spelled += spellings()[static_cast<unsigned char>(c)];
  if (const auto whole = ids_.find(std::string_view(spelled)); whole != ids_.end()) {
    out.push_back(whole->second);
    return;
  }
  // One symbol per byte's spelling, linked left to right; merges join a symbol with its right neighbour.
  struct Symbol {
    std::size_t begin, size;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  std::size_t at = 0;
  for (const char c : piece) {
    const std::size_t size = spellings()[static_cast<unsigned char>(c)].size();
    const int i = static_cast<int>(symbols.size());
    symbols.push_back({at, size, i - 1, i + 1 < static_cast<int>(piece.size()) ? i + 1 : -1});
    at += size;
  }
  struct Candidate {
    int rank, left;
    std::size_t left_size, right_size;  // the pair as it was when queued: stale once either side grew
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  std::string key;
  auto consider = [&](int left) {
    if (left < 0 || symbols[left].next < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[l.next];
    key.assign(spelled, l.begin, l.size);
    key += ' ';
    key.append(spelled, r.begin, r.size);
    if (const auto rank = merge_ranks_.find(std::string_view(key)); rank != merge_ranks_.end()) {
      queue.push({rank->second, left, l.size, r.size});
    }
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = symbols[c.left];
    if (l.size != c.left_size || l.next < 0 || symbols[l.next].size != c.right_size) continue;  // stale
    Symbol& r = symbols[l.next];
    l.size += r.size;
    r.size = 0;
    l.next = r.next;
    if (l.next >= 0) symbols[l.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view text = std::string_view(spelled).substr(symbols[i].begin, symbols[i].size);
    if (const auto id = ids_.find(text); id != ids_.end()) {
      out.push_back(id->second);
      continue;
    }
    // A merge whose result is not a token: its bytes one by one (each has a token, checked at load).
    for (std::size_t k = 0; k < text.size();) {
      const std::size_t n = utf8_length_at(text, k);
      out.push_back(ids_.find(text.substr(k, n))->second);
      k += n;
    }
  }
}

std::string_view ByteLevelBpe::decode(int token) const { return decoded_.at(static_cast<std::size_t>(token)); }

}  // namespace shardline::runtime
