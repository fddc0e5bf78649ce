#include "launch/topo_command.h"

#include <iostream>

#include <fmt/format.h>

#include "common/error.h"
#include "common/printable.h"
#include "common/units.h"
#include "launch/cli_options.h"
#include "memory/binding.h"
#include "memory/placement.h"
#include "memory/system_memory.h"
#include "memory/topology.h"

namespace shardline::launch {

namespace {

std::string describe_caches(const memory::HostTopology& host) {
  std::string text;
  for (const auto& cache : host.caches) {
    if (!text.empty()) text += ", ";
    text += fmt::format("{} {} x{}", cache.name, format_bytes(static_cast<double>(cache.size_bytes)), cache.count);
  }
  return text.empty() ? "unknown" : text;
}

void print_topology(const memory::HostTopology& host) {
  std::cout << fmt::format("topology: {}{}\n", host.source, host.hostname.empty() ? "" : " (" + host.hostname + ")");
  std::cout << fmt::format("packages: {} | NUMA nodes: {} | cores: {} | PUs: {}\n", host.n_packages,
                           host.numa_nodes.size(), host.n_cores, host.n_pus);
  std::cout << fmt::format("caches: {}\n", describe_caches(host));
  for (const auto& node : host.numa_nodes) {
    std::vector<int> cores, pus;
    for (const auto& core : node.cores) {
      cores.push_back(core.index);
      pus.insert(pus.end(), core.pus.begin(), core.pus.end());
    }
    std::cout << fmt::format("numa node {}: {} | hwloc memory figure {} (informational; not used for sizing)\n",
                             node.os_index,
                             node.cores.empty() ? std::string("no cores (memory only)")
                                                : fmt::format("cores {} (PUs {})", memory::format_index_list(cores),
                                                              memory::format_index_list(pus)),
                             format_bytes(static_cast<double>(node.hwloc_memory_bytes)));
  }
  std::cout << fmt::format("gpus: {}\n", host.gpus.empty() ? std::string("none seen by hwloc") : [&] {
    std::string list;
    for (const auto& gpu : host.gpus) list += (list.empty() ? "" : ", ") + gpu;
    return list;
  }());
  if (!host.is_this_system) return;
  const memory::MemInfo mem = memory::read_meminfo();
  std::cout << fmt::format("memory: {} total, {} available (/proc/meminfo)\n",
                           format_bytes(static_cast<double>(mem.total_bytes)),
                           format_bytes(static_cast<double>(mem.available_bytes)));
  std::cout << fmt::format("hugepages: 2 MiB pool {} total, {} free ({} reserved by mappings) | transparent: {}{}\n",
                           mem.hugepages_total, mem.hugepages_free, mem.hugepages_reserved,
                           memory::transparent_hugepage_mode(),
                           memory::thp_disabled_for_process() ? " (refused by this process)" : "");
  const std::vector<int> mine = memory::process_cpus();
  std::cout << fmt::format("this process: may run on PUs {}{}\n", memory::format_index_list(host.allowed_pus),
                           memory::is_launcher_bound(host, mine)
                               ? fmt::format(", bound to PUs {}", memory::format_index_list(mine))
                               : ", not bound");
}

}  // namespace

int topo_command(const std::vector<std::string>& args) {
  int np = 1;
  std::string bind = "auto", synthetic, xml;
  po::options_description options("topo options");
  options.add_options()
      ("np", po::value(&np)->default_value(1), "ranks on this host to show placements for")
      ("bind", po::value(&bind)->default_value("auto"), "placement mode, as for run: auto|numa|core|none")
      ("synthetic", po::value(&synthetic), "use an hwloc synthetic topology instead of this host, e.g. 'pack:2 numa:2 core:8 pu:2'")
      ("xml", po::value(&xml), "use a topology saved by `lstopo FILE.xml` instead of this host");
  po::variables_map vm;
  const std::string usage =
      "Usage: shardline topo [--np N] [--bind auto|numa|core|none] [--synthetic DESC | --xml FILE]\n\n"
      "Prints the host's topology (packages, NUMA nodes and their cores, caches, GPUs, memory, hugepages) and\n"
      "the placement each of N local CPU ranks would get from `shardline run --bind MODE` (a rank that drives\n"
      "a GPU goes to its GPU's node instead: `run --device cuda -v` prints where). Needs no MPI job; under\n"
      "mpirun or srun it runs on each host's first task.";
  if (!parse_command_line("topo", usage, options, args, vm)) return 0;
  check_rank_flag("--np", np);  // (2^31 ranks planned their placements in memory without end)
  if (vm.count("synthetic") && synthetic.empty()) {  // else an empty description showed this host instead
    throw ConfigError("--synthetic needs a description, e.g. 'pack:2 numa:2 core:8 pu:2'");
  }
  if (vm.count("xml") && xml.empty()) throw ConfigError("--xml needs a file name (write one with `lstopo FILE.xml`)");
  if (!synthetic.empty() && !xml.empty()) throw ConfigError("--synthetic and --xml are alternatives; pass one");
  const memory::BindMode mode = memory::parse_bind_mode(bind);
  const memory::HostTopology host = !synthetic.empty() ? memory::load_synthetic_topology(synthetic)
                                    : !xml.empty()     ? memory::load_xml_topology(xml, /*with_devices=*/true)
                                                       : memory::discover_host_topology();
  // Plan every rank before printing, so an impossible request prints one error line and nothing else.
  std::vector<memory::RankPlacement> placements;
  try {
    for (int r = 0; r < np; ++r) placements.push_back(memory::plan_placement(host, r, np, mode));
  } catch (const ResourceError& e) {
    // Nothing to place ranks on: this host lacks it (exit 4), but a description given here is what is wrong:
    // the flag's (2) or the file's (3).
    if (!synthetic.empty()) throw ConfigError(fmt::format("--synthetic '{}': {}", printable(synthetic), e.what()));
    if (!xml.empty()) throw FormatError(fmt::format("--xml '{}': {}", printable(xml), e.what()));
    throw;
  }
  print_topology(host);
  std::cout << fmt::format("\nplacement of {} local rank{} (--bind {}):\n", np, np == 1 ? "" : "s", bind);
  for (const auto& p : placements) std::cout << fmt::format("  local rank {}: {}\n", p.local_rank, p.describe());
  return 0;
}

}  // namespace shardline::launch
