#include "launch/agreed_fields.h"

#include <algorithm>
#include <cstddef>
#include <functional>

#include <fmt/format.h>

#include "common/error.h"
#include "common/printable.h"

namespace shardline::launch {

namespace {

// Longer values are shown by their start; 60 characters keep a message on a line or two.
constexpr std::size_t kShownChars = 60;

void append_text(std::string& bytes, std::string_view text) {
  bytes += fmt::format("{}:", text.size());
  bytes += text;
}

std::string_view take_text(std::string_view& bytes) {
  const std::size_t colon = bytes.find(':');
  std::size_t length = 0;
  bool digits = colon != std::string_view::npos && colon > 0 && colon <= 12;
  for (std::size_t i = 0; digits && i < colon; ++i) {
    digits = bytes[i] >= '0' && bytes[i] <= '9';
    length = length * 10 + static_cast<std::size_t>(bytes[i] - '0');
  }
  if (!digits || bytes.size() - colon - 1 < length) {  // another build's bytes: a difference like any other
    throw ConfigError("rank 0's start-up fields arrived malformed; is every host running the same shardline build?");
  }
  const std::string_view text = bytes.substr(colon + 1, length);
  bytes.remove_prefix(colon + 1 + length);
  return text;
}

// A value in the error line: control characters and bytes that are not UTF-8 escaped, so a prompt cannot
// break the line or act on a terminal.
std::string shown(const std::string& value) { return fmt::format("'{}'", printable(value, 200)); }

}  // namespace

std::string given(bool yes) { return yes ? "given" : "not given"; }

std::string count_or_not_given(int count) { return count == 0 ? given(false) : std::to_string(count); }

std::string comparable_value(std::string_view text) {
  if (text.size() <= kShownChars) return std::string(text);
  std::size_t cut = kShownChars;  // not inside a UTF-8 character
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes, digest {:016x})", text.substr(0, cut), text.size(),
                     std::hash<std::string_view>{}(text));
}

std::string encode_fields(const AgreedFields& fields) {
  std::string bytes;
  for (const auto& field : fields) {
    append_text(bytes, field.name);
    append_text(bytes, field.value);
  }
  return bytes;
}

AgreedFields decode_fields(std::string_view bytes) {
  AgreedFields fields;
  while (!bytes.empty()) {
    AgreedField field;
    field.name = take_text(bytes);
    field.value = take_text(bytes);
    fields.push_back(std::move(field));
  }
  return fields;
}

std::optional<FieldDifference> first_difference(const AgreedFields& mine, const AgreedFields& rank0) {
  if (rank0.empty()) return std::nullopt;  // rank 0 failed to list its own: its error is the one to report
  const std::size_t n = std::max(mine.size(), rank0.size());
  for (std::size_t i = 0; i < n; ++i) {
    const AgreedField* a = i < mine.size() ? &mine[i] : nullptr;
    const AgreedField* b = i < rank0.size() ? &rank0[i] : nullptr;
    if (a && b && a->name == b->name && a->value == b->value) continue;
    if (a && b && a->name != b->name) {  // another build's fields: name this rank's
      return FieldDifference{a->name, a->value, fmt::format("no such field (rank 0 has '{}' there)", b->name)};
    }
    const std::string name = a ? a->name : b->name;
    return FieldDifference{name, a ? a->value : "(none)", b ? b->value : "(none)"};  // a build with fewer fields
  }
  return std::nullopt;
}

std::string describe_difference(const FieldDifference& d, int rank, bool rank0_alone, std::string_view fix) {
  if (rank0_alone) {
    return fmt::format("rank 0's {} differs from every other rank's ({} on rank 0, {} on rank {} and the rest); {}",
                       d.name, shown(d.rank0), shown(d.mine), rank, fix);  // this rank: the lowest that differs
  }
  return fmt::format("this rank's {} differs from rank 0's ({} here, {} on rank 0); {}", d.name, shown(d.mine),
                     shown(d.rank0), fix);
}

}  // namespace shardline::launch
