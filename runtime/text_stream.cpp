#include "runtime/text_stream.h"

#include "common/printable.h"

namespace shardline::runtime {

namespace {

bool is_continuation(unsigned char b) { return b >= 0x80 && b <= 0xBF; }

// The length of the character a lead byte starts (0: not a lead byte: C0, C1 and F5-FF never are).
std::size_t lead_length(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::string_view TextStream::add(std::string_view piece) {
  const bool high_byte = piece.size() == 1 && static_cast<unsigned char>(piece[0]) >= 0x80;
  if (!high_byte || tokenizer_->is_byte_level()) {
    pending_.clear();  // a character cut short by this piece: its bytes are dropped
    return tokenizer_->prints(piece) ? piece : std::string_view();
  }
  const auto b = static_cast<unsigned char>(piece[0]);
  if (is_continuation(b) && !pending_.empty()) {
    pending_.push_back(piece[0]);
    if (pending_.size() < lead_length(static_cast<unsigned char>(pending_[0]))) return {};
    completed_.swap(pending_);
    pending_.clear();
    const std::size_t n = utf8_sequence_bytes(completed_, 0);  // 0: an overlong or surrogate form
    if (n != completed_.size() || utf8_is_control(completed_, 0, n)) return {};
    return completed_;
  }
  pending_.clear();  // a stray continuation byte, or a new lead byte cutting the last character short
  if (lead_length(b) != 0) pending_.assign(1, piece[0]);
  return {};
}

}  // namespace shardline::runtime
