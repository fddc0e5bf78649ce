#include "launch/launch_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::launch {

namespace {

std::string layout_text(const LaunchRequest& r) {
  return fmt::format("tp={} x pp={}", r.tp_size, r.pp_size);
}

// "a:2, b:2" for messages; the first hosts of a long file, then how many more.
std::string slots_text(const Hostfile& file) {
  constexpr std::size_t kListed = 8;
  std::string text;
  for (std::size_t i = 0; i < file.hosts.size() && i < kListed; ++i) {
    const HostEntry& h = file.hosts[i];
    text += fmt::format("{}{}:{}", i == 0 ? "" : ", ", h.host, h.slots ? std::to_string(*h.slots) : "?");
  }
  if (file.hosts.size() > kListed) text += fmt::format(" and {} more hosts", file.hosts.size() - kListed);
  return text;
}

void check_rank_count(const LaunchRequest& r, int needed) {
  if (!r.n_ranks || *r.n_ranks == needed) return;
  const int n = *r.n_ranks;
  if (n > needed) {
    throw ConfigError(fmt::format("--np {} starts {} ranks but {} uses {}: the extra ranks would hold no shard; "
                                  "launch exactly {} (mpirun -np {}) or raise --tp/--pp",
                                  n, n, layout_text(r), needed, needed, needed));
  }
  // Too few ranks is a missing resource (exit 4), as too few slots, tasks or Slurm tasks are; too many (above) a
  // layout that would leave ranks idle (exit 2).
  throw ResourceError(fmt::format("--np {} starts {} rank{} but {} needs {}: launch {} (mpirun -np {}) or lower --tp/--pp",
                                n, n, n == 1 ? "" : "s", layout_text(r), needed, needed, needed));
}

// Ranks fill node 0's tasks, then node 1's (srun's default block distribution).
std::vector<std::string> hosts_by_block(const std::vector<std::pair<std::string, int>>& capacity, int needed) {
  std::vector<std::string> hosts;
  for (const auto& [host, slots] : capacity) {
    for (int i = 0; i < slots && static_cast<int>(hosts.size()) < needed; ++i) hosts.push_back(host);
  }
  if (static_cast<int>(hosts.size()) < needed) hosts.clear();
  return hosts;
}

void check_slurm(const LaunchRequest& r, int needed, LaunchCheckReport& report) {
  const SlurmAllocation& s = *r.slurm;
  if (s.n_tasks <= 0) return;  // an allocation without a task count: srun decides, nothing to compare
  if (s.n_tasks < needed) {
    throw ResourceError(fmt::format("the Slurm allocation of job {} has {} task{} (SLURM_NTASKS) but {} needs {} "
                                    "ranks, one per task: submit with --ntasks={} (e.g. --nodes=N "
                                    "--ntasks-per-node={} with N x {} = {}), or use a smaller layout",
                                    s.job_id, s.n_tasks, s.n_tasks == 1 ? "" : "s", layout_text(r), needed, needed,
                                    r.tp_size, r.tp_size, needed));
  }
  if (s.n_tasks > needed && !r.n_ranks) {
    throw ConfigError(fmt::format("the Slurm allocation of job {} has {} tasks but {} uses {}: srun starts one rank "
                                  "per task, so submit with --ntasks={} (or pass --np {} and run srun -n {})",
                                  s.job_id, s.n_tasks, layout_text(r), needed, needed, needed, needed));
  }
  if (report.rank_hosts.empty() && !s.tasks_per_node.empty()) {
    std::vector<std::pair<std::string, int>> capacity;
    for (std::size_t i = 0; i < s.tasks_per_node.size(); ++i) {
      capacity.emplace_back(fmt::format("node {}", i), s.tasks_per_node[i]);
    }
    report.rank_hosts = hosts_by_block(capacity, needed);
  }
}

void check_hostfile(const LaunchRequest& r, int needed, LaunchCheckReport& report) {
  const Hostfile& file = *r.hostfile;
  const std::optional<std::int64_t> slots = file.total_slots();
  if (!slots) {  // some host leaves its slot count to mpirun (its cores), which cannot be seen from here
    std::string hosts;
    for (const auto& h : file.hosts) {
      if (!h.slots) hosts += fmt::format("{}'{}'", hosts.empty() ? "" : ", ", h.host);
    }
    report.warnings.push_back(fmt::format("hostfile {}: {} give{} no slots=, so mpirun gives {} as many slots as its "
                                          "cores, which cannot be counted from here: whether the {} ranks fit is "
                                          "not checked (add slots=N to be sure)",
                                          file.path, hosts, hosts.find(',') == std::string::npos ? "s" : "",
                                          hosts.find(',') == std::string::npos ? "it" : "each", needed));
    return;
  }
  if (*slots < needed && !r.oversubscribe) {
    throw ResourceError(fmt::format("hostfile {} offers {} slot{} ({}) but {} needs {} ranks: raise slots= (one per "
                                    "rank a host may run), add hosts, or allow --oversubscribe here and in mpirun",
                                    file.path, *slots, *slots == 1 ? "" : "s", slots_text(file), layout_text(r),
                                    needed));
  }
  if (*slots < needed) {
    std::int64_t max_total = 0;
    for (const auto& h : file.hosts) {
      if (!h.max_slots) return;  // no hard limit somewhere: mpirun may oversubscribe freely
      max_total += *h.max_slots;
    }
    if (max_total < needed) {
      throw ResourceError(fmt::format("hostfile {} allows at most {} ranks (max_slots) but {} needs {}: raise "
                                      "max_slots or add hosts",
                                      file.path, max_total, layout_text(r), needed));
    }
    return;  // oversubscribed: where mpirun wraps around is its business
  }
  std::vector<std::pair<std::string, int>> capacity;
  for (const auto& h : file.hosts) capacity.emplace_back(h.host, *h.slots);
  report.rank_hosts = hosts_by_block(capacity, needed);
}

void check_rankfile(const LaunchRequest& r, int needed, LaunchCheckReport& report) {
  std::vector<std::string> hosts(needed);
  for (const auto& e : r.rankfile) {
    if (e.rank >= needed) {
      throw ConfigError(fmt::format("rankfile line {} places rank {} but {} uses ranks 0-{}: remove it or raise "
                                    "--tp/--pp",
                                    e.line, e.rank, layout_text(r), needed - 1));
    }
    std::string host = e.host;
    if (host.rfind("+n", 0) == 0 && r.hostfile) {
      const std::size_t index = std::stoul(host.substr(2));
      if (index >= r.hostfile->hosts.size()) {
        throw ConfigError(fmt::format("rankfile line {} names {} but hostfile {} lists {} host{}", e.line, host,
                                      r.hostfile->path, r.hostfile->hosts.size(),
                                      r.hostfile->hosts.size() == 1 ? "" : "s"));
      }
      host = r.hostfile->hosts[index].host;
    } else if (r.hostfile && !r.hostfile->find(host)) {
      throw ConfigError(fmt::format("rankfile line {} places rank {} on '{}', which hostfile {} does not list: "
                                    "mpirun only starts ranks on hosts of the hostfile",
                                    e.line, e.rank, host, r.hostfile->path));
    }
    hosts[e.rank] = host;
  }
  for (int rank = 0; rank < needed; ++rank) {
    if (hosts[rank].empty()) {
      throw ConfigError(fmt::format("the rankfile places no rank {}: give one line for each of ranks 0-{} "
                                    "({} uses {} ranks)",
                                    rank, needed - 1, layout_text(r), needed));
    }
  }
  report.rank_hosts = hosts;
}

// The cores a rankfile slot names, as "socket:core" or "core" keys: "0", "0-3", "1,3", "1:0-7" (mpirun's
// forms). A form this does not know gives its text as one key, so only identical specs compare equal then.
std::set<std::string> slot_cores(const std::string& slot) {
  const std::size_t colon = slot.find(':');
  const std::string prefix = colon == std::string::npos ? "" : slot.substr(0, colon + 1);
  const std::string list = colon == std::string::npos ? slot : slot.substr(colon + 1);
  std::set<std::string> cores;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    int first = 0, last = 0;
    char dash = 0;
    if (std::sscanf(item.c_str(), "%d%c%d", &first, &dash, &last) == 3 && dash == '-' && first <= last &&
        last - first < 4096) {
      for (int c = first; c <= last; ++c) cores.insert(prefix + std::to_string(c));
    } else if (item.find_first_not_of("0123456789") == std::string::npos && !item.empty()) {
      cores.insert(prefix + item);
    } else {
      return {slot};
    }
    begin = end + 1;
  }
  return cores;
}

// mpirun accepts ranks bound to the same cores; they then take turns on them, which a user rarely means.
// Each core key of each host remembers the first rank line bound to it, so a file of n lines costs the
// cores its slots name, not n^2 comparisons of them (300 lines of slot=0:0-4095 ran for minutes). Each line
// is paired with the first line bound to a core it shares (lines A, B and C on one core: A-B and A-C), and
// after eight pairs a count of the rest is said.
void warn_shared_cores(const LaunchRequest& r, LaunchCheckReport& report) {
  constexpr std::size_t kMaxPairsSaid = 8;
  std::map<std::pair<std::string, std::string>, std::size_t> first_on;  // (host, core) -> rankfile entry
  std::set<std::pair<std::size_t, std::size_t>> pairs;                  // entries sharing a core
  for (std::size_t j = 0; j < r.rankfile.size(); ++j) {
    const std::string& host = report.rank_hosts[r.rankfile[j].rank];
    for (const std::string& core : slot_cores(r.rankfile[j].slot)) {
      const auto [it, first] = first_on.emplace(std::make_pair(host, core), j);
      if (!first) pairs.emplace(it->second, j);
    }
  }
  std::size_t said = 0;
  for (const auto& [i, j] : pairs) {
    if (said++ == kMaxPairsSaid) break;
    const RankfileEntry &a = r.rankfile[i], &b = r.rankfile[j];
    report.warnings.push_back(fmt::format("rankfile lines {} and {} bind ranks {} and {} to the same cores of {} "
                                          "(slot={} and slot={}): they will take turns on them",
                                          a.line, b.line, a.rank, b.rank, report.rank_hosts[a.rank], a.slot, b.slot));
  }
  if (pairs.size() > kMaxPairsSaid) {
    report.warnings.push_back(fmt::format("... and {} more pairs of rankfile lines that share cores",
                                          pairs.size() - kMaxPairsSaid));
  }
}

void warn_split_tp_groups(const LaunchRequest& r, LaunchCheckReport& report) {
  if (report.rank_hosts.empty() || r.tp_size == 1) return;
  for (int stage = 0; stage < r.pp_size; ++stage) {
    const int first = stage * r.tp_size, last = first + r.tp_size - 1;
    std::set<std::string> hosts(report.rank_hosts.begin() + first, report.rank_hosts.begin() + last + 1);
    if (hosts.size() == 1) continue;
    std::string names;
    for (const auto& h : hosts) names += (names.empty() ? "" : ", ") + h;
    report.warnings.push_back(fmt::format("the TP group of stage {} (ranks {}-{}) spans {}: its two reductions per "
                                          "layer cross the network; give each host a multiple of tp={} ranks",
                                          stage, first, last, names, r.tp_size));
  }
}

}  // namespace

std::string LaunchCheckReport::summary(int tp_size, int pp_size) const {
  std::string text = fmt::format("tp={} x pp={} = {} rank{}", tp_size, pp_size, n_ranks, n_ranks == 1 ? "" : "s");
  if (rank_hosts.empty()) return text;
  // Consecutive ranks on one host as a range: "node01 ranks 0-1, node02 ranks 2-3". A job of thousands of
  // hosts keeps the first ranges and the last (one line of 500 hosts is read by nobody).
  constexpr std::size_t kRunsShown = 8;
  std::vector<std::string> runs;
  for (std::size_t begin = 0; begin < rank_hosts.size();) {
    std::size_t end = begin;
    while (end + 1 < rank_hosts.size() && rank_hosts[end + 1] == rank_hosts[begin]) ++end;
    runs.push_back(fmt::format("{} {}", rank_hosts[begin],
                               begin == end ? fmt::format("rank {}", begin) : fmt::format("ranks {}-{}", begin, end)));
    begin = end + 1;
  }
  if (runs.size() > kRunsShown) {
    const std::size_t hidden = runs.size() - (kRunsShown - 1);
    runs.erase(runs.begin() + (kRunsShown - 2), runs.end() - 1);
    runs.insert(runs.end() - 1, fmt::format("... {} more ranges ...", hidden));
  }
  text += ":";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    text += i == 0 ? " " : ", ";
    text += runs[i];
  }
  return text;
}

LaunchCheckReport check_launch(const LaunchRequest& r) {
  if (r.tp_size < 1 || r.pp_size < 1) throw ConfigError("--tp and --pp must be >= 1");
  if (r.n_ranks && *r.n_ranks < 1) throw ConfigError("--np must be >= 1");
  const long long product = static_cast<long long>(r.tp_size) * r.pp_size;  // an int product could wrap
  if (product > std::numeric_limits<int>::max()) {
    throw ConfigError(fmt::format("tp={} x pp={} is more ranks than a job can hold", r.tp_size, r.pp_size));
  }
  const int needed = static_cast<int>(product);
  LaunchCheckReport report;
  report.n_ranks = needed;
  check_rank_count(r, needed);
  // With a rankfile mpirun places each rank where it says, whatever the hostfile's slot counts (checked
  // against Open MPI 4.1): the hostfile then only lists the hosts a rank may name.
  if (r.hostfile && r.rankfile.empty()) check_hostfile(r, needed, report);
  if (!r.rankfile.empty()) {
    check_rankfile(r, needed, report);
    warn_shared_cores(r, report);
  }
  if (r.slurm) check_slurm(r, needed, report);
  warn_split_tp_groups(r, report);
  return report;
}

}  // namespace shardline::launch
