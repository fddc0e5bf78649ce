// Open MPI hostfiles and rankfiles, read the way `mpirun --hostfile` / `--rankfile` read them, so that
// `shardline launch-check` can reject a bad one with file:line before mpirun starts a single rank.
//
// Hostfile (one host per line; '#' starts a comment; a host listed twice adds up its slots, as mpirun does):
//   node01 slots=2               # two ranks may start here
//   node02 slots=2 max_slots=4   # up to four with --oversubscribe
//   10.0.0.7                     # no slots=: mpirun counts the host's cores, unknown here
// Keyword aliases Open MPI accepts: count / cpu for slots; max-slots, slots_max, slots-max for max_slots.
//
// Rankfile (one rank per line; the slot is socket:cores or a logical core list):
//   rank 0=node01 slot=0:0-7
//   rank 1=node01 slot=1:0-7
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/input_file.h"

namespace shardline::launch {

struct HostEntry {
  std::string host;              // as written, without a "user@" prefix
  std::optional<int> slots;      // nullopt: mpirun uses the host's core count
  std::optional<int> max_slots;  // nullopt: no hard limit given
  int line = 0;                  // first line that names the host
};

struct Hostfile {
  std::string path;
  std::vector<HostEntry> hosts;  // in file order, each host once

  // Sum of slots, or nullopt when a host leaves its count to mpirun.
  std::optional<std::int64_t> total_slots() const;
  const HostEntry* find(const std::string& host) const;
};

struct RankfileEntry {
  int rank = 0;
  std::string host;  // a name, or "+n<i>": the i-th host of the hostfile / allocation
  std::string slot;  // as written, e.g. "0:0-7"
  int line = 0;
};

// Parse text that came from `path` (the path only names errors). Throw ConfigError "path:line: ..." for
// anything mpirun would reject or misread: unknown keywords, counts that are not positive integers,
// max_slots below slots, several hosts on one line, no host at all, repeated ranks.
Hostfile parse_hostfile(const std::string& text, const std::string& path);
std::vector<RankfileEntry> parse_rankfile(const std::string& text, const std::string& path);

// Read and parse a file; ResourceError when it cannot be read, or is a pipe that gives nothing for
// pipe_timeout_s (common/input_file.h).
Hostfile read_hostfile(const std::string& path, double pipe_timeout_s = kPipedTextTimeoutS);
std::vector<RankfileEntry> read_rankfile(const std::string& path, double pipe_timeout_s = kPipedTextTimeoutS);

}  // namespace shardline::launch
