#include "memory/topology.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"
#include "common/printable.h"
#include "memory/hwloc_handle.h"

namespace shardline::memory {

namespace detail {

namespace {

// hwloc 2.9 dereferences a null bitmap on some damaged XML files (an object with a cpuset but no
// complete_cpuset: a fuzzing pass, SIGSEGV in hwloc_topology_load), and on others prints a banner ("hwloc has
// encountered an out-of-order XML topology load ... check that your input topology XML file is valid") and
// goes on with a topology it calls wrong. A file is therefore loaded first in a child process, its stderr
// kept: if hwloc dies there or prints that banner, the file is refused by name, with the banner's gist.
// (Only `topo --xml` reads XML, before any MPI or kernel thread exists, so forking is safe.)
void refuse_xml_that_hwloc_cannot_take(const std::string& path, bool with_io) {
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) return;  // no trial then; the load below still reports what hwloc reports
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(err[0]);
    ::close(err[1]);
    return;
  }
  if (child == 0) {
    const rlimit no_core{0, 0};  // a crash here is expected of a bad file: no core dump or crash report for it
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::dup2(err[1], STDERR_FILENO);
    ::close(err[0]);
    // hwloc's banner is on unless these hide it (hwloc 2.x's and 3's names): say it, whatever the user set.
    ::setenv("HWLOC_HIDE_ERRORS", "0", 1);
    ::setenv("HWLOC_SHOW_CRITICAL_ERRORS", "1", 1);
    hwloc_topology_t t = nullptr;
    bool loaded = hwloc_topology_init(&t) == 0 && hwloc_topology_set_xml(t, path.c_str()) == 0 &&
                  (!with_io || hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) == 0) &&
                  hwloc_topology_load(t) == 0;
    ::_exit(loaded ? 0 : 1);  // (no destructors, no atexit handlers of the parent's)
  }
  ::close(err[1]);
  std::string said;  // what hwloc wrote, up to the child's end
  char chunk[4096];
  for (ssize_t n; (n = ::read(err[0], chunk, sizeof chunk)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (said.size() < (1 << 16)) said.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(err[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (const std::size_t banner = said.find("hwloc has encountered"); banner != std::string::npos) {
    // "* hwloc has encountered an out-of-order XML topology load.\n* Object PU cpuset ... complete ...\n* was
    // inserted after ...": the two lines after the first name the objects.
    std::string gist;
    std::size_t at = said.find('\n', banner);
    for (int line = 0; line < 2 && at != std::string::npos; ++line) {
      const std::size_t end = said.find('\n', at + 1);
      std::string text = said.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
      if (text.rfind("* ", 0) == 0) text.erase(0, 2);
      gist += (gist.empty() ? "" : " ") + text;
      at = end;
    }
    std::string what = said.substr(banner, said.find('\n', banner) - banner);
    if (!what.empty() && what.back() == '.') what.pop_back();
    if (!gist.empty() && gist.back() == '.') gist.pop_back();
    throw FormatError(fmt::format("'{}' is not a valid hwloc topology XML: {} ({}); write one with `lstopo FILE.xml`",
                                  path, what, gist));
  }
  if (!WIFSIGNALED(status)) return;
  const int signal = WTERMSIG(status);
  if (signal == SIGPIPE) return;  // it wrote after a failed read here: no verdict, the load below has its own
  if (signal == SIGSEGV || signal == SIGBUS || signal == SIGABRT || signal == SIGFPE || signal == SIGILL) {
    throw FormatError(fmt::format("'{}' is not a valid hwloc topology XML: hwloc crashed reading it (signal {}), as "
                                  "it does on some damaged or hand-edited files; write one with `lstopo FILE.xml`",
                                  path, signal));
  }
  throw ResourceError(fmt::format("reading topology XML '{}' was stopped by signal {} (out of memory?)", path, signal));
}

// Why hwloc rejects a synthetic description, or "" if it does not say: hwloc writes its parser's reason to
// stderr only with HWLOC_SYNTHETIC_VERBOSE set, so the description is parsed again on a throwaway topology
// with the variable set and stderr sent to a temporary file (at start-up, before any thread).
std::string synthetic_rejection_reason(const std::string& description) {
  std::FILE* captured = std::tmpfile();
  if (captured == nullptr) return "";
  const char* previous = std::getenv("HWLOC_SYNTHETIC_VERBOSE");
  const std::string saved_setting = previous != nullptr ? previous : "";
  std::fflush(stderr);
  const int saved_stderr = ::dup(STDERR_FILENO);
  if (saved_stderr >= 0 && ::dup2(::fileno(captured), STDERR_FILENO) >= 0) {
    ::setenv("HWLOC_SYNTHETIC_VERBOSE", "1", 1);
    hwloc_topology_t scratch = nullptr;
    if (hwloc_topology_init(&scratch) == 0) {
      hwloc_topology_set_synthetic(scratch, description.c_str());
      hwloc_topology_destroy(scratch);
    }
    std::fflush(stderr);
    ::dup2(saved_stderr, STDERR_FILENO);
    if (previous != nullptr) {
      ::setenv("HWLOC_SYNTHETIC_VERBOSE", saved_setting.c_str(), 1);
    } else {
      ::unsetenv("HWLOC_SYNTHETIC_VERBOSE");
    }
  }
  if (saved_stderr >= 0) ::close(saved_stderr);
  std::string reason;
  std::rewind(captured);
  char line[512];
  while (std::fgets(line, sizeof line, captured) != nullptr && reason.size() < 2000) {
    std::string text(line);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    if (text.empty()) continue;
    reason += reason.empty() ? text : "; " + text;
  }
  std::fclose(captured);
  return reason;
}

}  // namespace

void check_hwloc(int code, const char* what) {
  if (code >= 0) return;
  const int saved = errno;
  throw ResourceError(fmt::format("hwloc {} failed: {}", what, saved ? std::strerror(saved) : "unknown error"));
}

HwlocHandle::HwlocHandle(Source source, const std::string& argument, bool with_io) {
  check_hwloc(hwloc_topology_init(&topology_), "topology init");
  try {
    if (source == Source::kSynthetic && hwloc_topology_set_synthetic(topology_, argument.c_str()) < 0) {
      const std::string reason = synthetic_rejection_reason(argument);
      throw ConfigError(fmt::format("hwloc rejects the synthetic topology '{}'{} (example: 'pack:2 numa:2 core:8 pu:2')",
                                    printable(argument), reason.empty() ? "" : ": " + printable(reason, 400)));
    }
    // A missing file is a missing resource (exit 4), an unreadable one a corrupt input (exit 3).
    if (source == Source::kXml) {
      try {
        require_input_file(argument, "topology XML", InputKind::kRegularFile);
      } catch (const ResourceError& e) {
        throw ResourceError(fmt::format("{} (write one with `lstopo FILE.xml`)", e.what()));
      }
    }
    if (source == Source::kXml && hwloc_topology_set_xml(topology_, argument.c_str()) < 0) {
      // hwloc's parser sets errno to EINVAL for a file it cannot make sense of (a truncated one among them).
      throw FormatError(fmt::format("'{}' is not a valid hwloc topology XML (write one with `lstopo FILE.xml`)",
                                    argument));
    }
    if (with_io) check_hwloc(hwloc_topology_set_io_types_filter(topology_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT), "io filter");
    if (source == Source::kXml) refuse_xml_that_hwloc_cannot_take(argument, with_io);
    if (hwloc_topology_load(topology_) < 0) {
      if (source == Source::kXml) {
        throw FormatError(fmt::format("'{}' is not a valid hwloc topology XML (hwloc could not build a topology from "
                                      "it; write one with `lstopo FILE.xml`)",
                                      argument));
      }
      check_hwloc(-1, "topology load");
    }
  } catch (...) {
    hwloc_topology_destroy(topology_);
    throw;
  }
}

HwlocHandle::~HwlocHandle() {
  if (topology_) hwloc_topology_destroy(topology_);
}

const HwlocHandle& this_host() {
  static const HwlocHandle handle(HwlocHandle::Source::kThisSystem);
  return handle;
}

std::vector<int> to_indices(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (hwloc_bitmap_weight(set) < 0) return out;  // infinite set: never for real cpusets
  unsigned index = 0;
  hwloc_bitmap_foreach_begin(index, set) { out.push_back(static_cast<int>(index)); }
  hwloc_bitmap_foreach_end();
  return out;
}

BitmapPtr to_bitmap(const std::vector<int>& indices) {
  BitmapPtr set(hwloc_bitmap_alloc());
  if (!set) throw ResourceError("hwloc bitmap allocation failed");
  for (int i : indices) hwloc_bitmap_set(set.get(), static_cast<unsigned>(i));
  return set;
}

}  // namespace detail

namespace {

using detail::HwlocHandle;

const char* cache_name(hwloc_obj_t obj) {
  switch (obj->type) {
    case HWLOC_OBJ_L1CACHE: return obj->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION ? "L1i" : "L1d";
    case HWLOC_OBJ_L1ICACHE: return "L1i";
    case HWLOC_OBJ_L2CACHE: return "L2";
    case HWLOC_OBJ_L3CACHE: return "L3";
    case HWLOC_OBJ_L4CACHE: return "L4";
    case HWLOC_OBJ_L5CACHE: return "L5";
    default: return nullptr;
  }
}

HostTopology summarize(const HwlocHandle& handle, std::string source) {
  hwloc_topology_t topo = handle.get();
  HostTopology host;
  host.source = std::move(source);
  host.is_this_system = hwloc_topology_is_thissystem(topo) != 0;
  if (host.is_this_system) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host.hostname = name;
  }
  host.n_packages = std::max(0, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE));
  host.n_cores = std::max(0, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
  host.n_pus = std::max(0, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);
  host.allowed_pus = detail::to_indices(allowed);

  // Each core goes to the first node (in logical order) whose CPUs contain it: nodes that share CPUs with
  // an earlier node (HBM or CXL memory next to DRAM) come out memory-only and are not placement targets.
  const int n_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  std::vector<char> core_taken(static_cast<std::size_t>(host.n_cores), 0);
  for (int n = 0; n < n_nodes; ++n) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n);
    NumaNodeInfo info;
    // Node numbers are what mbind and set_mempolicy take: below Linux's largest MAX_NUMNODES (a hand-edited
    // XML's os_index="-5" read as 4294967291 became node -5 and placed nothing: a fuzzing pass).
    constexpr unsigned kMaxNodeNumber = 1u << 16;
    if (node->os_index >= kMaxNodeNumber) {
      throw FormatError(fmt::format("the topology's NUMA node {} has the OS index {}, which is no node number (a "
                                    "damaged or hand-edited XML? write one with `lstopo FILE.xml`)",
                                    n, static_cast<int>(node->os_index)));
    }
    info.os_index = static_cast<int>(node->os_index);
    info.hwloc_memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    hwloc_obj_t core = nullptr;
    while ((core = hwloc_get_next_obj_inside_cpuset_by_type(topo, node->cpuset, HWLOC_OBJ_CORE, core)) != nullptr) {
      if (core_taken[core->logical_index]) continue;
      detail::BitmapPtr usable(hwloc_bitmap_alloc());
      hwloc_bitmap_and(usable.get(), core->cpuset, allowed);
      if (hwloc_bitmap_iszero(usable.get())) continue;  // none of its CPUs is ours
      core_taken[core->logical_index] = 1;
      info.cores.push_back({static_cast<int>(core->logical_index), detail::to_indices(usable.get())});
    }
    host.numa_nodes.push_back(std::move(info));
  }

  // Caches: one entry per (level, kind), with the size of one instance and the instance count.
  for (hwloc_obj_type_t type : {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L1ICACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE,
                                HWLOC_OBJ_L4CACHE}) {
    const int count = hwloc_get_nbobjs_by_type(topo, type);
    if (count <= 0) continue;
    hwloc_obj_t first = hwloc_get_obj_by_type(topo, type, 0);
    host.caches.push_back({cache_name(first), first->attr->cache.size, count});
  }

  for (hwloc_obj_t dev = hwloc_get_next_osdev(topo, nullptr); dev; dev = hwloc_get_next_osdev(topo, dev)) {
    const auto kind = dev->attr->osdev.type;
    if (kind != HWLOC_OBJ_OSDEV_GPU && kind != HWLOC_OBJ_OSDEV_COPROC) continue;
    std::string name = dev->name ? dev->name : "?";
    const char* model = hwloc_obj_get_info_by_name(dev, "GPUModel");
    if (!model && dev->parent && dev->parent->type == HWLOC_OBJ_PCI_DEVICE) {
      model = hwloc_obj_get_info_by_name(dev->parent, "PCIDevice");
    }
    if (model) name += fmt::format(" ({})", model);
    host.gpus.push_back(std::move(name));
  }

  for (hwloc_obj_t dev = hwloc_get_next_pcidev(topo, nullptr); dev; dev = hwloc_get_next_pcidev(topo, dev)) {
    const auto& pci = dev->attr->pcidev;
    PciDeviceInfo info;
    info.bus_id = fmt::format("{:04x}:{:02x}:{:02x}.{:x}", pci.domain, pci.bus, pci.dev, pci.func);
    info.class_id = pci.class_id;
    const char* vendor = hwloc_obj_get_info_by_name(dev, "PCIVendor");
    const char* device = hwloc_obj_get_info_by_name(dev, "PCIDevice");
    if (vendor && device) {
      info.name = fmt::format("{} {}", vendor, device);
    } else if (dev->name) {
      info.name = dev->name;
    }
    // I/O objects have no cpuset or nodeset of their own: their locality is that of the first normal object
    // above them (hwloc attaches a host bridge below the package or NUMA group it is wired to).
    hwloc_obj_t anchor = hwloc_get_non_io_ancestor_obj(topo, dev);
    if (anchor && anchor->nodeset) info.numa_nodes = detail::to_indices(anchor->nodeset);
    host.pci_devices.push_back(std::move(info));
  }
  return host;
}

}  // namespace

std::vector<const NumaNodeInfo*> HostTopology::nodes_with_cores() const {
  std::vector<const NumaNodeInfo*> out;
  for (const auto& node : numa_nodes) {
    if (!node.cores.empty()) out.push_back(&node);
  }
  return out;
}

HostTopology discover_host_topology(bool with_devices) {
  HwlocHandle handle(HwlocHandle::Source::kThisSystem, {}, with_devices);
  return summarize(handle, "this host");
}

namespace {

// The most hardware threads a synthetic topology may have. hwloc and the summary take about 2 s for 16384
// and grow faster than the count (40 s for 65536); a description of millions ran until killed. The largest
// real hosts have a few thousand.
constexpr long long kMaxSyntheticThreads = 16384;

// The hardware threads a synthetic description makes: the product of its levels' arities. A level is a word
// ("core:8", "core:8(attributes)", or a bare "8", which hwloc also takes); memory attached in brackets
// ("[numa]") and attributes in parentheses are no levels. Stops counting once past the limit.
long long synthetic_threads(const std::string& description) {
  long long threads = 1;
  std::size_t i = 0;
  while (i < description.size()) {
    while (i < description.size() && std::isspace(static_cast<unsigned char>(description[i]))) ++i;
    std::string level;  // the word, without what its parentheses and brackets hold
    int depth = 0;
    bool attached_memory = i < description.size() && description[i] == '[';
    for (; i < description.size() && (depth > 0 || !std::isspace(static_cast<unsigned char>(description[i]))); ++i) {
      const char c = description[i];
      if (c == '(' || c == '[') ++depth;
      if (depth == 0) level += c;
      if ((c == ')' || c == ']') && depth > 0) --depth;
    }
    if (attached_memory || level.empty()) continue;
    const std::size_t colon = level.rfind(':');
    const std::size_t digits = colon == std::string::npos ? 0 : colon + 1;
    long long arity = 0;
    for (std::size_t j = digits; j < level.size() && std::isdigit(static_cast<unsigned char>(level[j])); ++j) {
      arity = std::min(arity * 10 + (level[j] - '0'), kMaxSyntheticThreads + 1);
    }
    if (arity > 0) threads = std::min(threads * arity, kMaxSyntheticThreads + 1);
  }
  return threads;
}

}  // namespace

HostTopology load_synthetic_topology(const std::string& description) {
  if (synthetic_threads(description) > kMaxSyntheticThreads) {
    throw ConfigError(fmt::format("the synthetic topology '{}' has more than {} hardware threads; describe a host of "
                                  "at most that many",
                                  printable(description), kMaxSyntheticThreads));
  }
  HwlocHandle handle(HwlocHandle::Source::kSynthetic, description);
  return summarize(handle, fmt::format("synthetic '{}'", description));
}

HostTopology load_xml_topology(const std::string& path, bool with_devices) {
  HwlocHandle handle(HwlocHandle::Source::kXml, path, with_devices);
  return summarize(handle, fmt::format("xml '{}'", path));
}

std::string format_index_list(std::vector<int> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::string out;
  for (std::size_t i = 0; i < values.size();) {
    std::size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", values[i]) : fmt::format("{}-{}", values[i], values[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

}  // namespace shardline::memory
