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

// How the weights are stored, for the rates that depend on it: kernels for bf16 and int8 weights stream
// fewer bytes per multiply and may run on other units (AMX, VNNI, tensor cores) than fp32's.
enum class WeightFormat { kF32, kBf16, kInt8 };
const char* weight_format_name(WeightFormat format);

// The rates of ops on one weight format. In a DomainSpec a bf16 or int8 field of 0 means "not measured":
// the fp32 field applies (the same bytes per second and FLOP rate as fp32 weights).
struct FormatRates {
  double core_bandwidth_bytes_per_s = 0;    // weights one core streams from memory (GEMV)
  double domain_bandwidth_bytes_per_s = 0;  // all cores of the domain together
  double cache_bandwidth_bytes_per_s = 0;   // one core, weights in the last-level cache
  double core_flops = 0;                    // one core's GEMM rate, 64 rows (a prefill chunk)
  double small_batch_flops = 0;             // the same with 16 rows (a decode batch); 0 = core_flops
  double row_element_s = 0;                 // one core's time per element of a row's element-wise work

  double small_batch_rate() const { return small_batch_flops > 0 ? small_batch_flops : core_flops; }
};

// One memory domain (a NUMA node with its cores, or one GPU).
struct DomainSpec {
  int cores = 1;                              // cores (CPU) or 1 (GPU)
  double memory_bytes = 0;                    // memory usable by the ranks of this domain
  double core_bandwidth_bytes_per_s = 0;      // weights streamed by one core (GEMV), from memory
  double domain_bandwidth_bytes_per_s = 0;    // all cores of the domain together
  double core_flops = 0;                      // one core's fp32 GEMM rate (FLOP/s), 64 rows
  double small_batch_flops = 0;               // optional: the same with 16 rows (0 = core_flops)
  double cache_bytes = 0;                     // last-level cache of the domain; 0 = ignore caching
  double cache_bandwidth_bytes_per_s = 0;     // one core, when the rank's weights fit in its cache share
  double op_overhead_s = 2e-6;                // fixed cost of one kernel call (thread fork/join, launch)
  // Work per activation row that no matrix prices, on one core (0 = not priced): per element of the
  // row-wise ops (residual add, RMSNorm, the row prepared for the weights' kernels, RoPE, SwiGLU, cache
  // writes) and per attention head beyond its bytes and FLOPs (softmax, folding the scores).
  double row_element_s = 0;
  double attention_head_s = 0;
  // Attention's own rates: the rows of one sequence (a prefill chunk's) a kernel thread attends at once,
  // reading the cache once for them (1 = each row reads it: the GPU, and CPUs without such a kernel), and
  // one core's attention FLOP rate over a long context (0 = core_flops, the fp32 GEMM's).
  int attention_rows = 1;
  double attention_flops = 0;
  // How much of an op's shorter bound (memory or compute) its time adds to the longer: 0 = they overlap
  // fully (the plain roofline, max), 1 = not at all (their sum).
  double overlap_loss = 0;
  // Fixed cost of one step inside a parallel pass (a barrier of the rank's threads: the CPU stage runs each
  // half layer as one pass). Negative = not given: every op is its own kernel call, as on a GPU.
  double step_overhead_s = -1;
  FormatRates bf16;                           // optional: bf16 weights' rates (0 = fp32's)
  FormatRates int8;                           // optional: int8 weights' rates (0 = fp32's)

  // The rates for weights of `format`: its own where given, fp32's (the fields above) elsewhere.
  FormatRates rates(WeightFormat format) const;
  // Sets them: fp32's are the fields above, bf16's and int8's their members.
  void set_rates(WeightFormat format, const FormatRates& rates);
};

// What runs a rank's stage: a CPU domain's cores, or one GPU per domain (run --device cuda). It decides what
// the run can be given (the CUDA stage keeps an fp32 KV cache and takes no int8 weights) and what a Slurm
// script must ask for (the GPUs).
enum class Device { kCpu, kCuda };
const char* device_name(Device device);

struct ClusterSpec {
  std::string name = "cluster";
  Device device = Device::kCpu;
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
