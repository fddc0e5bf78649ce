// "Did you mean ...?" for a misspelt name (a flag, a key of a JSON file): the closest of the known names
// within two edits, or a name the typed text starts. A typo in an optional setting otherwise reads as "use
// the default" and the run quietly does something else than asked.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace shardline {

// Edits (insert, delete, replace one character) that turn a into b.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known name closest to typed: one it is the start of, else one within two edits; empty when none is.
template <typename Names>
std::string closest_name(std::string_view typed, const Names& known) {
  std::string best;
  std::size_t best_distance = 3;  // more than two edits: no suggestion
  for (const auto& candidate : known) {
    const std::string_view name(candidate);
    if (name.empty() || name == typed) continue;
    const std::size_t distance = name.starts_with(typed) ? 1 : edit_distance(typed, name);
    if (distance < best_distance) {
      best_distance = distance;
      best = std::string(name);
    }
  }
  return best;
}

}  // namespace shardline
