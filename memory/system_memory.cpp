#include "memory/system_memory.h"

#include <sys/prctl.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace shardline::memory {

MemInfo read_meminfo() {
  MemInfo info;
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    if (!(fields >> key >> value)) continue;
    if (key == "MemTotal:") info.total_bytes = value * 1024;
    else if (key == "MemAvailable:") info.available_bytes = value * 1024;
    else if (key == "HugePages_Total:") info.hugepages_total = static_cast<long>(value);
    else if (key == "HugePages_Free:") info.hugepages_free = static_cast<long>(value);
    else if (key == "HugePages_Rsvd:") info.hugepages_reserved = static_cast<long>(value);
  }
  return info;
}

namespace {

// A number file of a cgroup ("max" and v1's near-2^63 "unlimited" read as nullopt).
std::optional<std::uint64_t> read_cgroup_number(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    const unsigned long long value = std::stoull(text);
    if (value >= (1ull << 62)) return std::nullopt;  // v1 writes PAGE_COUNTER_MAX pages' bytes for "no limit"
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// One "key value" line of a cgroup's memory.stat, or 0.
std::uint64_t read_stat_value(const std::filesystem::path& file, const std::string& wanted) {
  std::ifstream in(file);
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == wanted) return value;
  }
  return 0;
}

// The least (limit - usage) from dir up to root, both inclusive. Usage counts the page cache, which the
// kernel keeps until the limit and then reclaims: its inactive file pages are taken as free, as
// MemAvailable counts reclaimable cache (a job that had read its model file looked out of memory).
std::optional<std::uint64_t> least_left(std::filesystem::path dir, const std::filesystem::path& root,
                                        const char* limit_name, const char* usage_name, const char* inactive_key) {
  std::optional<std::uint64_t> left;
  for (;;) {
    const auto limit = read_cgroup_number(dir / limit_name);
    if (limit) {
      const std::uint64_t usage = read_cgroup_number(dir / usage_name).value_or(0);
      const std::uint64_t inactive = read_stat_value(dir / "memory.stat", inactive_key);
      const std::uint64_t used = usage > inactive ? usage - inactive : 0;
      const std::uint64_t here = *limit > used ? *limit - used : 0;
      left = left ? std::min(*left, here) : here;
    }
    if (dir == root || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return left;
}

}  // namespace

std::optional<std::uint64_t> cgroup_memory_left(const std::string& proc_self_cgroup, const std::string& sysfs_root) {
  namespace fs = std::filesystem;
  // Normalised, without a trailing separator: the walk up stops where it equals the mount.
  fs::path root = fs::path(sysfs_root).lexically_normal();
  if (!root.has_filename() && root.has_parent_path() && root != root.root_path()) root = root.parent_path();
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-id:controllers:path": v2 is "0::/path", v1's memory controller "4:memory:/path".
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const fs::path path = fs::path(line.substr(second + 1)).relative_path();
    const bool v2 = line.compare(0, first, "0") == 0 && controllers.empty();
    bool memory = false;
    for (std::size_t at = 0; at <= controllers.size();) {
      const std::size_t comma = std::min(controllers.find(',', at), controllers.size());
      if (controllers.compare(at, comma - at, "memory") == 0) memory = true;
      at = comma + 1;
    }
    if (!v2 && !memory) continue;
    const fs::path mount = v2 ? root : root / "memory";
    // Inside a cgroup namespace (a container) the path is relative to the namespace's root, which is the
    // mount's root: the full path then does not exist under the mount, and the mount's root is the cgroup.
    std::error_code ec;
    const fs::path dir = fs::is_directory(mount / path, ec) ? mount / path : mount;
    const auto left = v2 ? least_left(dir, mount, "memory.max", "memory.current", "inactive_file")
                         : least_left(dir, mount, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file");
    if (left) return left;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> cgroup_memory_left() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return cgroup_memory_left(text.str());
}

std::optional<std::uint64_t> usable_memory_bytes() {
  const std::uint64_t available = read_meminfo().available_bytes;  // 0: no MemAvailable (kernels before 3.14)
  const auto left = cgroup_memory_left();
  if (available == 0) return left;
  return left ? std::min(available, *left) : available;
}

std::uint64_t process_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  const std::string key = field + ":";
  for (std::string word; in >> word;) {
    if (word == key) {
      std::uint64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

std::optional<std::uint64_t> address_space_left() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const std::uint64_t mapped = process_status_bytes("VmSize");
  return limit.rlim_cur > mapped ? limit.rlim_cur - mapped : 0;
}

long free_hugepages_on_node(int node) {
  std::ifstream in(fmt::format("/sys/devices/system/node/node{}/hugepages/hugepages-2048kB/free_hugepages", node));
  long value = -1;
  if (!(in >> value)) return -1;
  return value;
}

std::string transparent_hugepage_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "unavailable";
  // "always [madvise] never": the bracketed word is the mode.
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

bool thp_disabled_for_process() { return prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1; }

Backing backing_of(const void* address, std::uint64_t bytes) {
  Backing b;
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  const auto end = begin + bytes;
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool overlapping = false;
  std::uint64_t vma_bytes = 0;
  while (std::getline(in, line)) {
    // A VMA header: "7f12a0000000-7f12a0400000 rw-p 00000000 00:00 0 ..."; fields follow as "Key: N kB".
    const auto dash = line.find('-');
    const auto space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      overlapping = lo < end && hi > begin;
      vma_bytes = hi - lo;
      continue;
    }
    if (!overlapping) continue;
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "Rss:") b.resident_bytes += kib * 1024;
    else if (key == "AnonHugePages:") b.anon_huge_bytes += kib * 1024;
    else if (key == "KernelPageSize:" && kib == 2048) b.hugetlb_bytes += vma_bytes;
  }
  return b;
}

}  // namespace shardline::memory
