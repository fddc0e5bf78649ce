// Runs under `mpirun -np N` (registered in tests/CMakeLists.txt, label mpi). Every rank takes its place as
// `shardline run` does (MPI shared-memory split, runtime::bind_this_rank, pinned kernel threads, an arena
// and a KV pool on the rank's node), then checks the result with hwloc and get_mempolicy directly, not
// through memory/binding.h:
//   - the process's CPU binding (hwloc_get_cpubind) is the placement's CPU set, and each kernel thread is
//     pinned to its core under --bind core (and under a launcher's binding of one core per thread);
//   - arena pages and KV blocks have an MPOL_BIND policy on the placement's node, and sit on it;
//   - the ranks of a host have disjoint CPU sets when each has its own cores;
//   - with --expect=launcher (mpirun --bind-to core), the launcher's binding is detected and kept.
// Flags: --bind=auto|numa|core|none  --expect=planned|launcher
#include <hwloc.h>
#include <mpi.h>
#include <numaif.h>
#include <omp.h>
#include <unistd.h>

#include <bitset>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/host_group.h"
#include "memory/arena.h"
#include "memory/kv_block_pool.h"
#include "memory/placement.h"
#include "memory/topology.h"
#include "runtime/rank_binding.h"

namespace shardline {
namespace {

constexpr int kMaxCpus = 1024;
using CpuMask = std::bitset<kMaxCpus>;

struct Options {
  memory::BindMode bind = memory::BindMode::kAuto;
  bool expect_launcher = false;
};

// What this rank did, once, before the tests look at it.
struct Placed {
  Options options;
  memory::HostTopology host;
  comm::HostRanks ranks;
  std::vector<int> initial_cpus;
  runtime::RankBinding binding;
  int threads = 1;
  std::unique_ptr<memory::Arena> arena;
  std::unique_ptr<memory::KvBlockPool> pool;
  int kv_block = -1;
};
Placed* g_placed = nullptr;

// hwloc, used here on its own so the check does not go through the code under test.
std::vector<int> cpubind(int flags) {
  hwloc_topology_t topology;
  hwloc_topology_init(&topology);
  hwloc_topology_load(topology);
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  EXPECT_EQ(hwloc_get_cpubind(topology, set, flags), 0);
  std::vector<int> out;
  unsigned i = 0;
  hwloc_bitmap_foreach_begin(i, set) { out.push_back(static_cast<int>(i)); }
  hwloc_bitmap_foreach_end();
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(topology);
  return out;
}

CpuMask mask_of(const std::vector<int>& cpus) {
  CpuMask mask;
  for (int c : cpus) mask.set(static_cast<std::size_t>(c));
  return mask;
}

void expect_bound_to_node(const void* address, int node, const char* what) {
  int mode = -1;
  unsigned long nodes[kMaxCpus / 64] = {};
  ASSERT_EQ(get_mempolicy(&mode, nodes, kMaxCpus, const_cast<void*>(address), MPOL_F_ADDR), 0) << std::strerror(errno);
  EXPECT_EQ(mode, MPOL_BIND) << what;
  EXPECT_EQ(nodes[0], 1ul << node) << what;
  int on = -1;
  ASSERT_EQ(get_mempolicy(&on, nullptr, 0, const_cast<void*>(address), MPOL_F_NODE | MPOL_F_ADDR), 0);
  EXPECT_EQ(on, node) << what << " page is on another node";
}

TEST(Placement, HostSplitAgreesWithTheLauncher) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  ASSERT_NE(local, nullptr);
  EXPECT_EQ(g_placed->ranks.local_rank, std::atoi(local));
  EXPECT_EQ(g_placed->ranks.local_size, std::atoi(local_size));
}

TEST(Placement, CpuBindingIsWhatThePlacementSays) {
  const auto& p = g_placed->binding.placement;
  const std::vector<int> now = cpubind(HWLOC_CPUBIND_PROCESS);
  if (g_placed->options.expect_launcher) {
    EXPECT_TRUE(p.launcher_bound) << p.describe();
    EXPECT_LT(g_placed->initial_cpus.size(), g_placed->host.allowed_pus.size()) << "mpirun did not bind";
    EXPECT_EQ(now, g_placed->initial_cpus) << "the launcher's binding was changed";
    EXPECT_EQ(p.pus, now);
    return;
  }
  // Recompute the plan independently of bind_this_rank and compare with what the kernel reports.
  const memory::RankPlacement expected =
      memory::plan_placement(g_placed->host, g_placed->ranks.local_rank, g_placed->ranks.local_size, g_placed->options.bind);
  EXPECT_FALSE(p.launcher_bound);
  EXPECT_EQ(p.applied, expected.applied);
  EXPECT_EQ(p.numa_node, expected.numa_node);
  EXPECT_EQ(p.pus, expected.pus);
  if (expected.applied == memory::BindMode::kNone) {
    EXPECT_EQ(now, g_placed->initial_cpus);
  } else {
    EXPECT_EQ(now, expected.pus);
  }
}

TEST(Placement, KernelThreadsArePinnedOnePerCore) {
  const auto& p = g_placed->binding.placement;
  // Ours under --bind core; a launcher's binding kept (p.cores: its cores) when it has one core per thread.
  const bool launcher_one_per_core = p.launcher_bound && static_cast<int>(p.cores.size()) == g_placed->threads;
  if (p.applied != memory::BindMode::kCore && !launcher_one_per_core) {
    EXPECT_EQ(g_placed->binding.pinned_threads, 0);
    return;
  }
  EXPECT_EQ(g_placed->binding.pinned_threads, g_placed->threads);
  // The kernels' OpenMP team: the same pool threads, in the same order, for the same thread count.
  std::vector<std::vector<int>> seen(static_cast<std::size_t>(g_placed->threads));
#pragma omp parallel num_threads(g_placed->threads)
  seen[omp_get_thread_num()] = cpubind(HWLOC_CPUBIND_THREAD);
  for (int t = 0; t < g_placed->threads; ++t) {
    EXPECT_EQ(seen[t], p.cores[t % p.cores.size()].pus) << "thread " << t;
  }
}

TEST(Placement, ThreadMemoryPrefersTheNode) {
  const int node = g_placed->binding.placement.numa_node;
  int mode = -1;
  unsigned long nodes[kMaxCpus / 64] = {};
  ASSERT_EQ(get_mempolicy(&mode, nodes, kMaxCpus, nullptr, 0), 0);
  if (node < 0) {  // --bind none: the policy is left alone
    EXPECT_EQ(mode, MPOL_DEFAULT);
    return;
  }
  EXPECT_EQ(mode, MPOL_PREFERRED);
  EXPECT_EQ(nodes[0], 1ul << node);
}

TEST(Placement, ArenaAndKvBlocksAreBoundToTheNode) {
  const int node = g_placed->binding.placement.numa_node;
  ASSERT_GE(node, 0) << "every mode but none binds memory; " << g_placed->binding.describe();
  EXPECT_TRUE(g_placed->arena->node_bound());
  void* a = g_placed->arena->allocate_bytes(1 << 20);
  std::memset(a, 1, 1 << 20);
  expect_bound_to_node(a, node, "arena");
  expect_bound_to_node(g_placed->pool->data(g_placed->kv_block), node, "KV block");
}

TEST(Placement, RanksOfAHostHaveDisjointCpusOrShareTheirWholeNode) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const CpuMask mine = mask_of(cpubind(HWLOC_CPUBIND_PROCESS));
  std::vector<unsigned long long> words(kMaxCpus / 64), all(static_cast<std::size_t>(world) * (kMaxCpus / 64));
  for (int i = 0; i < kMaxCpus; ++i) {
    if (mine.test(i)) words[i / 64] |= 1ull << (i % 64);
  }
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::vector<char> hosts(static_cast<std::size_t>(world) * 64);
  MPI_Allgather(words.data(), kMaxCpus / 64, MPI_UNSIGNED_LONG_LONG, all.data(), kMaxCpus / 64,
                MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
  MPI_Allgather(host, 64, MPI_CHAR, hosts.data(), 64, MPI_CHAR, MPI_COMM_WORLD);
  const int node = g_placed->binding.placement.numa_node;
  std::vector<int> nodes(static_cast<std::size_t>(world));
  MPI_Allgather(&node, 1, MPI_INT, nodes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  const auto& p = g_placed->binding.placement;
  const bool own_cores = p.applied == memory::BindMode::kCore || g_placed->options.expect_launcher;
  for (int a = 0; a < world; ++a) {
    for (int b = a + 1; b < world; ++b) {
      if (std::strncmp(&hosts[a * 64], &hosts[b * 64], 64) != 0) continue;
      for (int w = 0; w < kMaxCpus / 64; ++w) {
        const unsigned long long wa = all[a * (kMaxCpus / 64) + w], wb = all[b * (kMaxCpus / 64) + w];
        if (own_cores) {
          EXPECT_EQ(wa & wb, 0u) << "ranks " << a << " and " << b << " share CPUs";
        } else if (nodes[a] == nodes[b]) {
          EXPECT_EQ(wa, wb) << "ranks " << a << " and " << b << " share node " << nodes[a] << " but not its CPUs";
        }
      }
    }
  }
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--bind=", 0) == 0) options.bind = memory::parse_bind_mode(arg.substr(7));
    if (arg == "--expect=launcher") options.expect_launcher = true;
  }
  return options;
}

}  // namespace
}  // namespace shardline

int main(int argc, char** argv) {
  using namespace shardline;
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  Placed placed;
  placed.options = parse(argc, argv);
  placed.host = memory::discover_host_topology(false);
  placed.ranks = comm::mpi_host_ranks();
  placed.initial_cpus = cpubind(HWLOC_CPUBIND_PROCESS);
  placed.binding = runtime::bind_this_rank(placed.host, placed.ranks.local_rank, placed.ranks.local_size,
                                           placed.options.bind);
  placed.threads = placed.binding.default_threads(placed.host);
  runtime::start_kernel_threads(placed.binding, placed.threads);
  const int node = placed.binding.placement.numa_node;
  placed.arena = std::make_unique<memory::Arena>(memory::ArenaOptions{.initial_bytes = 4 << 20, .numa_node = node});
  placed.pool = std::make_unique<memory::KvBlockPool>(memory::KvBlockPoolOptions{64 * 1024, 8, node});
  placed.kv_block = placed.pool->allocate();
  std::printf("[r%d] %s | arena %s\n", placed.ranks.local_rank, placed.binding.describe().c_str(),
              placed.arena->describe().c_str());
  g_placed = &placed;
  int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  g_placed = nullptr;
  placed.pool.reset();
  placed.arena.reset();
  MPI_Finalize();
  return any;
}
