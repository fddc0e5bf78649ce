#include "memory/placement.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::memory {

BindMode parse_bind_mode(const std::string& text) {
  if (text == "auto") return BindMode::kAuto;
  if (text == "numa") return BindMode::kNuma;
  if (text == "core") return BindMode::kCore;
  if (text == "none") return BindMode::kNone;
  throw ConfigError(fmt::format("--bind expects auto, numa, core or none; got '{}'", text));
}

const char* bind_mode_name(BindMode mode) {
  switch (mode) {
    case BindMode::kAuto: return "auto";
    case BindMode::kNuma: return "numa";
    case BindMode::kCore: return "core";
    case BindMode::kNone: return "none";
  }
  return "?";
}

std::vector<int> RankPlacement::core_indices() const {
  std::vector<int> out;
  for (const auto& core : cores) out.push_back(core.index);
  return out;
}

std::string RankPlacement::describe() const {
  if (applied == BindMode::kNone && !launcher_bound) {
    return fmt::format("not bound (--bind {}){}", bind_mode_name(requested), note.empty() ? "" : "; " + note);
  }
  std::string where = numa_node >= 0 ? fmt::format("NUMA node {}", numa_node) : "no single NUMA node";
  std::string how = launcher_bound ? "bound by the launcher (kept)" : fmt::format("bind {}", bind_mode_name(applied));
  return fmt::format("{}, cores {} (PUs {}), {}{}", where, format_index_list(core_indices()), format_index_list(pus), how,
                     note.empty() ? "" : "; " + note);
}

namespace {

// Fills p's node, mode and cores for a rank that is index_on_node of the ranks_on_node ranks placed on node.
void place_on_node(RankPlacement& p, const NumaNodeInfo& node, int ranks_on_node, int index_on_node, BindMode mode) {
  p.ranks_on_node = ranks_on_node;
  const int n_cores = static_cast<int>(node.cores.size());
  if (mode == BindMode::kNone) {
    p.applied = BindMode::kNone;
    return;
  }
  p.numa_node = node.os_index;
  const bool cores_suffice = n_cores >= p.ranks_on_node;
  if (mode == BindMode::kCore && !cores_suffice) {
    throw ConfigError(fmt::format("--bind core: {} local ranks share NUMA node {}, which has only {} core{}; use "
                                  "--bind numa (or auto), or run fewer ranks per host",
                                  p.ranks_on_node, node.os_index, n_cores, n_cores == 1 ? "" : "s"));
  }
  if (mode == BindMode::kNuma || (mode == BindMode::kAuto && !cores_suffice)) {
    p.applied = BindMode::kNuma;
    if (mode == BindMode::kAuto) {
      p.note = fmt::format("{} ranks share node {}'s {} core{}, so they share its cores", p.ranks_on_node,
                           node.os_index, n_cores, n_cores == 1 ? "" : "s");
    }
    for (const auto& core : node.cores) {
      p.cores.push_back(core);
      p.pus.insert(p.pus.end(), core.pus.begin(), core.pus.end());
    }
  } else {
    p.applied = BindMode::kCore;
    const int begin = static_cast<int>(static_cast<long>(index_on_node) * n_cores / p.ranks_on_node);
    const int end = static_cast<int>(static_cast<long>(index_on_node + 1) * n_cores / p.ranks_on_node);
    for (int c = begin; c < end; ++c) {
      p.cores.push_back(node.cores[c]);
      p.pus.insert(p.pus.end(), node.cores[c].pus.begin(), node.cores[c].pus.end());
    }
  }
  std::sort(p.pus.begin(), p.pus.end());
}

std::vector<const NumaNodeInfo*> usable_nodes(const HostTopology& host) {
  auto nodes = host.nodes_with_cores();
  if (nodes.empty()) {
    throw ResourceError(fmt::format("the topology ({}) has no NUMA node with a usable core", host.source));
  }
  return nodes;
}

}  // namespace

RankPlacement plan_placement(const HostTopology& host, int local_rank, int local_size, BindMode mode) {
  SL_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size);
  RankPlacement p;
  p.local_rank = local_rank;
  p.local_size = local_size;
  p.requested = mode;
  const auto nodes = usable_nodes(host);
  const long n_nodes = static_cast<long>(nodes.size());
  // Contiguous blocks: slot(r) = floor(r * N / size); the first rank of slot k is ceil(k * size / N).
  const int slot = static_cast<int>(static_cast<long>(local_rank) * n_nodes / local_size);
  auto first_rank_of = [&](long k) { return static_cast<int>((k * local_size + n_nodes - 1) / n_nodes); };
  const int first = first_rank_of(slot);
  const int next_first = first_rank_of(slot + 1);
  place_on_node(p, *nodes[slot], next_first - first, local_rank - first, mode);
  return p;
}

RankPlacement plan_gpu_placement(const HostTopology& host, int local_rank, const std::vector<int>& gpu_numa_nodes,
                                 BindMode mode) {
  const int local_size = static_cast<int>(gpu_numa_nodes.size());
  SL_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size);
  const auto nodes = usable_nodes(host);
  auto node_with_index = [&](int os_index) -> const NumaNodeInfo* {
    for (const NumaNodeInfo* n : nodes) {
      if (n->os_index == os_index) return n;
    }
    return nullptr;
  };
  for (int r = 0; r < local_size; ++r) {
    if (node_with_index(gpu_numa_nodes[r]) != nullptr) continue;
    RankPlacement p = plan_placement(host, local_rank, local_size, mode);
    const std::string why = fmt::format("the GPU of local rank {} has no known NUMA node, so ranks are spread as "
                                        "without GPUs",
                                        r);
    p.note = p.note.empty() ? why : why + "; " + p.note;
    return p;
  }
  RankPlacement p;
  p.local_rank = local_rank;
  p.local_size = local_size;
  p.requested = mode;
  const int node = gpu_numa_nodes[local_rank];
  const int ranks_on_node = static_cast<int>(std::count(gpu_numa_nodes.begin(), gpu_numa_nodes.end(), node));
  const int index_on_node =
      static_cast<int>(std::count(gpu_numa_nodes.begin(), gpu_numa_nodes.begin() + local_rank, node));
  place_on_node(p, *node_with_index(node), ranks_on_node, index_on_node, mode);
  return p;
}

bool is_launcher_bound(const HostTopology& host, const std::vector<int>& bound_pus) {
  if (bound_pus.empty()) return false;
  const std::set<int> allowed(host.allowed_pus.begin(), host.allowed_pus.end());
  const std::set<int> bound(bound_pus.begin(), bound_pus.end());
  if (bound.size() >= allowed.size()) return false;
  return std::includes(allowed.begin(), allowed.end(), bound.begin(), bound.end());
}

RankPlacement adopt_launcher_binding(const HostTopology& host, const RankPlacement& planned,
                                     const std::vector<int>& bound_pus) {
  RankPlacement p = planned;
  p.launcher_bound = true;
  p.pus = bound_pus;
  std::sort(p.pus.begin(), p.pus.end());
  p.cores.clear();
  p.numa_node = -1;
  std::set<int> nodes_touched;
  const std::set<int> bound(bound_pus.begin(), bound_pus.end());
  for (const auto& node : host.numa_nodes) {
    for (const auto& core : node.cores) {
      const bool mine = std::any_of(core.pus.begin(), core.pus.end(), [&](int pu) { return bound.count(pu) > 0; });
      if (!mine) continue;
      CoreInfo kept{core.index, {}};
      for (int pu : core.pus) {
        if (bound.count(pu)) kept.pus.push_back(pu);
      }
      p.cores.push_back(std::move(kept));
      nodes_touched.insert(node.os_index);
    }
  }
  // Memory follows the CPUs: bind it to their node when they are on one (unless --bind none).
  if (nodes_touched.size() == 1 && planned.requested != BindMode::kNone) p.numa_node = *nodes_touched.begin();
  p.applied = BindMode::kNone;  // we bind no CPUs ourselves
  p.note = nodes_touched.size() > 1 ? fmt::format("the launcher's CPU set spans {} NUMA nodes, so memory is not bound",
                                                  nodes_touched.size())
                                    : "";
  return p;
}

}  // namespace shardline::memory
