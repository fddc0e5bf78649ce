// A cluster as the cost model sees it: identical hosts ("nodes"), each with a few memory domains (NUMA
// nodes or GPUs), each domain holding some rank slots; and three classes of links between ranks.
//
// Ranks fill slots in order (TP innermost, so a TP group takes neighbouring slots): rank r sits in slot r,
// slot s in domain s / ranks_per_domain, domain d on node d / domains_per_node.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace shardline::partition {

// time(bytes) = alpha + bytes * beta: latency α in seconds, inverse bandwidth β in seconds per byte.
struct LinkCost {
  double alpha_s = 0.0;
  double beta_s_per_byte = 0.0;
  double time_s(double bytes) const { return alpha_s + bytes * beta_s_per_byte; }
  double bandwidth_bytes_per_s() const { return beta_s_per_byte > 0 ? 1.0 / beta_s_per_byte : 0.0; }
};

enum class LinkClass { kSameDomain, kCrossDomain, kCrossNode };
const char* link_class_name(LinkClass link);

// One memory domain (a NUMA node with its cores, or one GPU).
struct DomainSpec {
  int cores = 1;                              // cores (CPU) or 1 (GPU)
  double memory_bytes = 0;                    // memory usable by the ranks of this domain
  double core_bandwidth_bytes_per_s = 0;      // weights streamed by one core (GEMV), from memory
  double domain_bandwidth_bytes_per_s = 0;    // all cores of the domain together
  double core_flops = 0;                      // one core's fp32 GEMM rate (FLOP/s)
  double cache_bytes = 0;                     // last-level cache of the domain; 0 = ignore caching
  double cache_bandwidth_bytes_per_s = 0;     // one core, when the rank's weights fit in its cache share
  double op_overhead_s = 2e-6;                // fixed cost of one kernel call (thread fork/join, launch)
};

struct ClusterSpec {
  std::string name = "cluster";
  int nodes = 1;
  int domains_per_node = 1;
  int ranks_per_domain = 1;  // slots the launcher fills per domain (1 = one rank per NUMA node / GPU)
  DomainSpec domain;
  LinkCost same_domain;   // ranks in one domain (shared memory)
  LinkCost cross_domain;  // different domains of one node (QPI/UPI, NVLink)
  LinkCost cross_node;    // different nodes (Ethernet, InfiniBand)

  int total_slots() const { return nodes * domains_per_node * ranks_per_domain; }
  int domain_of(int rank) const { return rank / ranks_per_domain; }
  int node_of(int rank) const { return domain_of(rank) / domains_per_node; }
  LinkClass link_between(int rank_a, int rank_b) const;
  const LinkCost& link(LinkClass link) const;
};

// JSON (schema in docs/planner.md). Throws ConfigError naming the field when something is missing or
// out of range.
ClusterSpec cluster_from_json(const nlohmann::json& j);
nlohmann::json cluster_to_json(const ClusterSpec& cluster);
ClusterSpec load_cluster_file(const std::string& path);

}  // namespace shardline::partition
