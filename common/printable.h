// Text from a user's file or flag, made safe to quote in an error line. Such text can hold anything: a
// prompt with escape sequences (which would recolour or overwrite the terminal), a hostfile line with a NUL
// (which cut the message short where it became a C string), a corrupt GGUF name length (which made a
// 14 MB error line). So control bytes (C0, DEL and C1: U+009B is a CSI some terminals obey), the bidi
// controls that reorder a line, backslashes and bytes that are not valid UTF-8 become \xHH, other UTF-8
// stays, and at most max_bytes of the text are shown, cut at a whole character, followed by "..." and how
// many bytes were left out.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace shardline {

// How long the UTF-8 character starting at text[i] is (2 to 4 bytes), or 0 when the bytes there are not one
// (a stray continuation byte, an overlong or surrogate form, a character cut off by the end of the text).
inline std::size_t utf8_sequence_bytes(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t j) { return static_cast<unsigned char>(text[j]); };
  const unsigned char lead = byte(i);
  std::size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) low = 0xA0;   // not overlong
    if (lead == 0xED) high = 0x9F;  // not a surrogate
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) low = 0x90;   // not overlong
    if (lead == 0xF4) high = 0x8F;  // at most U+10FFFF
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t j = i + 2; j < i + n; ++j) {
    if (byte(j) < 0x80 || byte(j) > 0xBF) return 0;
  }
  return n;
}

// Whether the n-byte UTF-8 character at text[i] is one a terminal acts on rather than shows: a C1 control
// (U+0080-U+009F) or a bidi embedding, override or isolate (U+202A-U+202E, U+2066-U+2069).
inline bool utf8_is_control(std::string_view text, std::size_t i, std::size_t n) {
  const auto byte = [&](std::size_t j) { return static_cast<unsigned char>(text[j]); };
  if (n == 2) return byte(i) == 0xC2 && byte(i + 1) < 0xA0;
  if (n != 3 || byte(i) != 0xE2) return false;
  return (byte(i + 1) == 0x80 && byte(i + 2) >= 0xAA && byte(i + 2) <= 0xAE) ||
         (byte(i + 1) == 0x81 && byte(i + 2) >= 0xA6 && byte(i + 2) <= 0xA9);
}

inline std::string printable(std::string_view text, std::size_t max_bytes = 120) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = c >= 0x80 ? utf8_sequence_bytes(text, i) : 1;  // 0: not UTF-8, one byte escaped
    const std::size_t bytes = n > 0 ? n : 1;
    if (i + bytes > max_bytes) break;
    const bool shown = n > 1 ? !utf8_is_control(text, i, n) : n == 1 && c >= 0x20 && c != 0x7f && c != '\\';
    if (shown) {
      out.append(text.substr(i, bytes));
    } else {
      for (std::size_t j = i; j < i + bytes; ++j) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[j]));
    }
    i += bytes;
  }
  if (i < text.size()) out += fmt::format("... ({} more bytes)", text.size() - i);
  return out;
}

}  // namespace shardline
