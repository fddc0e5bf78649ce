#include "launch/hostfile.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"
#include "common/printable.h"

namespace shardline::launch {

namespace {

constexpr const char* kHostfileLine = "hostfile lines are 'HOST [slots=N] [max_slots=N]'";
constexpr const char* kRankfileLine = "rankfile lines are 'rank N=HOST slot=SPEC', e.g. 'rank 0=node01 slot=0:0-7'";

// A line's blank-separated tokens, comments cut, with "key = value", "key= value" and "key =value" joined
// into "key=value" as Open MPI's hostfile lexer reads them ('localhost slots = 3' runs 3 ranks under mpirun).
std::vector<std::string> tokens_of(std::string line) {
  if (const std::size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
  std::vector<std::string> tokens;
  std::istringstream in(line);
  bool joining = false;  // the last token ends in '=' and waits for its value
  for (std::string t; in >> t;) {
    if (tokens.size() > 1 && (joining || t.front() == '=')) {
      tokens.back() += t;
    } else {
      tokens.push_back(t);
    }
    joining = tokens.size() > 1 && tokens.back().back() == '=';
  }
  return tokens;
}

// The longest line the files may hold. Real lines are a host name (at most 253 bytes) and a few fields;
// the rankfile's regular expression (libstdc++ matches recursively, a frame per byte) overflowed the stack
// on a line of about 30 KB.
constexpr std::size_t kMaxLineBytes = 4096;

std::vector<std::string> lines_of(const std::string& text, const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    // Open MPI 4.1's parsers refuse a carriage return ("parse error ... on token 1") but in a comment: a file
    // saved with Windows line endings fails at mpirun, so it fails here, with the way out.
    if (line.substr(0, line.find('#')).find('\r') != std::string::npos) {
      throw ConfigError(fmt::format("{}:{}: the line holds a carriage return (Windows line endings), which mpirun "
                                    "refuses; convert the file: sed -i 's/\\r$//' {}",
                                    path, lines.size() + 1, path));
    }
    if (line.size() > kMaxLineBytes) {
      throw ConfigError(fmt::format("{}:{}: a line of {} bytes; lines are at most {}", path, lines.size() + 1,
                                    line.size(), kMaxLineBytes));
    }
    lines.push_back(line);
  }
  return lines;
}

// Names and addresses Open MPI 4.1's node-name parser takes: letters, digits, '.' and '-' (it refuses '_',
// and ':', so IPv6 addresses, with "illegal character in the following node name"); at most 253 bytes, as
// DNS names are.
bool valid_host(const std::string& host) {
  if (host.empty() || host.size() > 253) return false;
  return std::all_of(host.begin(), host.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'; });
}

std::string where(const std::string& path, int line) { return fmt::format("{}:{}", path, line); }

// A count, rank or core number as the files write it: digits only, at most 6 of them (so std::stoi cannot
// overflow).
bool short_number(const std::string& text) {
  return !text.empty() && text.size() <= 6 && text.find_first_not_of("0123456789") == std::string::npos;
}

int positive_count(const std::string& path, int line, const std::string& key, const std::string& value) {
  const int n = short_number(value) ? std::stoi(value) : 0;
  if (n < 1) {
    throw ConfigError(fmt::format("{}: {}='{}' must be a whole number of ranks from 1 to 999999 ({})", where(path, line),
                                  key, printable(value), kHostfileLine));
  }
  return n;
}

std::string read_text(const std::string& path, const char* what, double pipe_timeout_s) {
  return read_text_input(path, what, pipe_timeout_s, kMaxTextInputBytes);
}

}  // namespace

std::optional<std::int64_t> Hostfile::total_slots() const {
  std::int64_t total = 0;  // (up to 999999 a host, and any number of hosts)
  for (const auto& h : hosts) {
    if (!h.slots) return std::nullopt;
    total += *h.slots;
  }
  return total;
}

const HostEntry* Hostfile::find(const std::string& host) const {
  for (const auto& h : hosts) {
    if (h.host == host) return &h;
  }
  return nullptr;
}

Hostfile parse_hostfile(const std::string& text, const std::string& path) {
  Hostfile file{path, {}};
  std::map<std::string, int> listings;  // host -> lines naming it
  const auto lines = lines_of(text, path);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int number = static_cast<int>(i) + 1;
    const auto tokens = tokens_of(lines[i]);
    if (tokens.empty()) continue;
    std::string host = tokens[0];
    if (const std::size_t at = host.find('@'); at != std::string::npos) host = host.substr(at + 1);
    if (host.find(',') != std::string::npos) {
      throw ConfigError(fmt::format("{}: '{}' names several hosts; {} (one host per line)", where(path, number),
                                    printable(tokens[0]), kHostfileLine));
    }
    // HOST:N is mpirun's --host syntax; its hostfile parser rejects the line ("illegal character").
    if (const std::size_t colon = host.find(':');
        colon != std::string::npos && host.find(':', colon + 1) == std::string::npos && colon + 1 < host.size() &&
        host.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
      const std::string name = host.substr(0, colon), count = host.substr(colon + 1);
      const bool plain = tokens.size() == 1 && count.find_first_not_of('0') != std::string::npos;  // just "HOST:N", N > 0
      throw ConfigError(fmt::format("{}: '{}' is mpirun's --host form; a hostfile line says '{} slots={}'",
                                    where(path, number), printable(tokens[0]), printable(name), plain ? count : "N"));
    }
    if (host.find('=') != std::string::npos || !valid_host(host)) {
      throw ConfigError(fmt::format("{}: '{}' is not a host name or IPv4 address mpirun takes (letters, digits, '.' "
                                    "and '-'); {}", where(path, number), printable(tokens[0]),
                                    kHostfileLine));
    }
    HostEntry entry{host, std::nullopt, std::nullopt, number};
    for (std::size_t t = 1; t < tokens.size(); ++t) {
      const std::string& token = tokens[t];
      const std::size_t eq = token.find('=');
      if (eq == std::string::npos) {
        throw ConfigError(fmt::format("{}: unexpected '{}' after host '{}' (several hosts on one line, or a "
                                      "missing '='?); {}",
                                      where(path, number), printable(token), host, kHostfileLine));
      }
      const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
      if (key == "slots" || key == "count" || key == "cpu") {
        if (entry.slots) throw ConfigError(fmt::format("{}: slots given twice for '{}'", where(path, number), host));
        entry.slots = positive_count(path, number, key, value);
      } else if (key == "max_slots" || key == "max-slots" || key == "slots_max" || key == "slots-max") {
        entry.max_slots = positive_count(path, number, key, value);
      } else if (key == "username" || key == "user_name" || key == "user-name" || key == "port") {
        // How mpirun reaches the host (ssh's user and port): nothing a layout depends on, and mpirun takes them.
        if (value.empty() || (key == "port" && !short_number(value))) {
          throw ConfigError(fmt::format("{}: {}='{}' needs {}; {}", where(path, number), printable(key), printable(value),
                                        key == "port" ? "a port number" : "a user name", kHostfileLine));
        }
      } else {
        throw ConfigError(fmt::format("{}: unknown keyword '{}'; {}", where(path, number), printable(key), kHostfileLine));
      }
    }
    if (entry.slots && entry.max_slots && *entry.max_slots < *entry.slots) {
      throw ConfigError(fmt::format("{}: max_slots={} is below slots={} for '{}'", where(path, number),
                                    *entry.max_slots, *entry.slots, host));
    }
    auto existing = std::find_if(file.hosts.begin(), file.hosts.end(), [&](const HostEntry& h) { return h.host == host; });
    if (existing == file.hosts.end()) {
      file.hosts.push_back(entry);
      listings[host] = 1;
      continue;
    }
    // mpirun counts a host listed k times without slots= as k slots, and rejects a repeat when any of its
    // lines gives slots=. (A host listed once without slots= gets its core count, unknown here.)
    const bool first_gave_slots = listings[host] == 1 && existing->slots.has_value();
    if (first_gave_slots || entry.slots || entry.max_slots) {
      throw ConfigError(fmt::format("{}: '{}' is already listed on line {}; give each host one line with slots=N",
                                    where(path, number), host, existing->line));
    }
    existing->slots = ++listings[host];
  }
  if (file.hosts.empty()) {
    throw ConfigError(fmt::format("{}: names no host; {}", path, kHostfileLine));
  }
  return file;
}

namespace {

// What is wrong with a rankfile slot, or nothing: a comma list of items, each [SOCKET:]CORES with SOCKET a
// number (or '*', which mpirun reads as 0) and CORES a number, a range N-M with N <= M, or '*' (mpirun's
// forms, e.g. 0:0-7, 1:0,1 and 0:2-3,1:0-1; it reports the others only at launch).
std::optional<std::string> slot_problem(const std::string& spec) {
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = spec.find(',', start);
    std::string item = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) return std::string("an empty item in its list");
    if (const std::size_t colon = item.find(':'); colon != std::string::npos) {
      const std::string socket = item.substr(0, colon);
      if (socket != "*" && !short_number(socket)) {
        return fmt::format("socket '{}' in '{}' is not a number", socket, item);
      }
      item = item.substr(colon + 1);
    }
    const std::size_t dash = item.find('-');
    if (item == "*" || short_number(item)) {
      // one core, or all of them
    } else if (dash != std::string::npos && short_number(item.substr(0, dash)) &&
               short_number(item.substr(dash + 1))) {
      if (std::stoi(item.substr(0, dash)) > std::stoi(item.substr(dash + 1))) {
        return fmt::format("range '{}' runs backwards", item);
      }
    } else {
      return fmt::format("'{}' is not a core or a range", item);
    }
    if (comma == std::string::npos) return std::nullopt;
    start = comma + 1;
  }
}

}  // namespace

std::vector<RankfileEntry> parse_rankfile(const std::string& text, const std::string& path) {
  // "rank 0=node01 slot=0:0-7"; blanks around '=' are allowed, as mpirun allows them.
  static const std::regex kRankLine(R"(^\s*rank\s+(\S+?)\s*=\s*(\S+)\s+slot\s*=\s*(\S+)\s*$)");
  std::vector<RankfileEntry> entries;
  std::map<int, int> seen;  // rank -> line
  const auto lines = lines_of(text, path);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int number = static_cast<int>(i) + 1;
    std::string line = lines[i];
    if (const std::size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    if (tokens_of(line).empty()) continue;
    std::smatch m;
    if (!std::regex_match(line, m, kRankLine)) {
      throw ConfigError(fmt::format("{}: '{}' is not a rank line; {}", where(path, number), printable(lines[i]), kRankfileLine));
    }
    const std::string rank_text = m[1], host = m[2], spec = m[3];
    if (!short_number(rank_text)) {
      throw ConfigError(fmt::format("{}: '{}' is not a rank number; {}", where(path, number), printable(rank_text), kRankfileLine));
    }
    const bool relative = host.rfind("+n", 0) == 0 && short_number(host.substr(2));
    if (!relative && !valid_host(host)) {
      throw ConfigError(fmt::format("{}: '{}' is not a host name, IPv4 address or +nI mpirun takes (names of letters, "
                                    "digits, '.' and '-'); {}", where(path, number), printable(host),
                                    kRankfileLine));
    }
    if (const auto problem = slot_problem(spec)) {
      throw ConfigError(fmt::format("{}: slot '{}' is not SOCKET:CORES or a core list ({}); {}", where(path, number),
                                    printable(spec), printable(*problem), kRankfileLine));
    }
    const int rank = std::stoi(rank_text);
    if (auto it = seen.find(rank); it != seen.end()) {
      throw ConfigError(fmt::format("{}: rank {} is already placed on line {}", where(path, number), rank, it->second));
    }
    seen[rank] = number;
    entries.push_back({rank, host, spec, number});
  }
  if (entries.empty()) throw ConfigError(fmt::format("{}: places no rank; {}", path, kRankfileLine));
  return entries;
}

Hostfile read_hostfile(const std::string& path, double pipe_timeout_s) {
  return parse_hostfile(read_text(path, "hostfile", pipe_timeout_s), path);
}

std::vector<RankfileEntry> read_rankfile(const std::string& path, double pipe_timeout_s) {
  return parse_rankfile(read_text(path, "rankfile", pipe_timeout_s), path);
}

}  // namespace shardline::launch
