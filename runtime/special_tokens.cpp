#include "runtime/special_tokens.h"

#include <algorithm>

namespace shardline::runtime {

SpecialTokens::SpecialTokens(std::vector<std::pair<std::string, int>> specials) {
  std::erase_if(specials, [](const auto& s) { return s.first.empty(); });
  // Longest first; equal lengths in the order given (llama.cpp's sort leaves their order unspecified).
  std::stable_sort(specials.begin(), specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (auto& [text, id] : specials) {
    const auto first = static_cast<unsigned char>(text[0]);
    by_first_byte_[first].push_back({std::move(text), id, n_++});
  }
}

std::vector<SpecialTokens::Piece> SpecialTokens::split(std::string_view text) const {
  struct Match {
    int rank;
    std::size_t at;
    const Special* special;
  };
  std::vector<Match> matches;
  if (n_ > 0) {
    for (std::size_t at = 0; at < text.size(); ++at) {
      for (const Special& s : by_first_byte_[static_cast<unsigned char>(text[at])]) {
        if (text.compare(at, s.text.size(), s.text) == 0) matches.push_back({s.rank, at, &s});
      }
    }
  }
  // Each special in llama.cpp's order takes, from the left, the occurrences that lie wholly in text that no
  // special before it took (its own earlier occurrences included).
  std::sort(matches.begin(), matches.end(),
            [](const Match& a, const Match& b) { return a.rank != b.rank ? a.rank < b.rank : a.at < b.at; });
  std::vector<bool> taken_bytes(matches.empty() ? 0 : text.size(), false);
  std::vector<Match> taken;
  for (const Match& m : matches) {
    const auto begin = taken_bytes.begin() + static_cast<std::ptrdiff_t>(m.at);
    const auto end = begin + static_cast<std::ptrdiff_t>(m.special->text.size());
    if (std::find(begin, end, true) != end) continue;
    std::fill(begin, end, true);
    taken.push_back(m);
  }
  std::sort(taken.begin(), taken.end(), [](const Match& a, const Match& b) { return a.at < b.at; });

  std::vector<Piece> pieces;
  std::size_t plain_from = 0;
  for (const Match& m : taken) {
    if (m.at > plain_from) pieces.push_back({text.substr(plain_from, m.at - plain_from), -1});
    pieces.push_back({text.substr(m.at, m.special->text.size()), m.special->id});
    plain_from = m.at + m.special->text.size();
  }
  if (plain_from < text.size()) pieces.push_back({text.substr(plain_from), -1});
  return pieces;
}

}  // namespace shardline::runtime
