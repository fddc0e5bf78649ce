// Placement and memory through the real binary: `shardline topo` on this host and on synthetic / saved
// topologies, the per-rank placement lines of `run --verbose` under mpirun (ours, and a launcher's binding
// kept), the arena tiers selected with --arena-pages (with hugepages really reserved, and always restored),
// a KV pool too small for the request as one clean error line, and paged / arena layouts reproducing the
// goldens under mpirun.
#include <algorithm>
#include <fstream>
#include <regex>
#include <vector>

#include <gtest/gtest.h>

#include "memory/placement.h"
#include "memory/topology.h"
#include "tests/support/golden_run.h"
#include "tests/support/hugepages.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

class Placement : public GoldenCliTest {};

#define REQUIRE_HUGEPAGE_CONTROL()                                                                        \
  do {                                                                                                    \
    if (!HugepagePool::can_change()) {                                                                    \
      if (in_ci()) FAIL() << "CI=true but /proc/sys/vm/nr_hugepages is not writable (run as root)";      \
      GTEST_SKIP() << "needs root to set /proc/sys/vm/nr_hugepages";                                      \
    }                                                                                                     \
  } while (0)

// --- shardline topo -------------------------------------------------------------------------------------

TEST_F(Placement, TopoShowsThisHostAndWhereEachLocalRankGoes) {
  const ProcessResult r = run_process(shardline_binary() + " topo --np 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  for (const char* part : {"topology: this host", "packages: ", "numa node ", "caches: ", "gpus: ", "memory: ",
                           "(/proc/meminfo)", "hugepages: 2 MiB pool", "transparent: ", "this process: may run on PUs",
                           "placement of 2 local ranks (--bind auto):"}) {
    EXPECT_NE(r.out.find(part), std::string::npos) << "missing '" << part << "' in:\n" << r.out;
  }
  // The lines are exactly the placement math on this host's topology.
  const memory::HostTopology host = memory::discover_host_topology(false);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line =
        "  local rank " + std::to_string(rank) + ": " + memory::plan_placement(host, rank, 2, memory::BindMode::kAuto).describe();
    EXPECT_NE(r.out.find(line + "\n"), std::string::npos) << "missing '" << line << "' in:\n" << r.out;
  }
}

TEST_F(Placement, TopoOnASyntheticTwoSocketHost) {
  const ProcessResult r = run_process(shardline_binary() + " topo --synthetic 'pack:2 numa:2 core:4 pu:2' --np 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("packages: 2 | NUMA nodes: 4 | cores: 16 | PUs: 32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("numa node 3: cores 12-15 (PUs 24-31)"), std::string::npos) << r.out;
  // Two ranks per node in rank order, two cores (four hyperthreads) each.
  EXPECT_NE(r.out.find("  local rank 0: NUMA node 0, cores 0-1 (PUs 0-3), bind core\n"
                       "  local rank 1: NUMA node 0, cores 2-3 (PUs 4-7), bind core\n"
                       "  local rank 2: NUMA node 1, cores 4-5 (PUs 8-11), bind core\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  local rank 7: NUMA node 3, cores 14-15 (PUs 28-31), bind core\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("memory: "), std::string::npos) << "no /proc/meminfo line for a topology that is not this host";
}

TEST_F(Placement, TopoOnASavedTopologyWithMemoryOnlyNodes) {
  const std::string xml = std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/topo-2socket-dram-plus-hbm.xml";
  const ProcessResult r = run_process(shardline_binary() + " topo --xml " + xml + " --np 2 --bind numa");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("numa node 1: no cores (memory only)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  local rank 0: NUMA node 0, cores 0-3 (PUs 0-7), bind numa\n"
                       "  local rank 1: NUMA node 2, cores 4-7 (PUs 8-15), bind numa\n"),
            std::string::npos)
      << r.out;
}

TEST_F(Placement, TopoOnASavedTopologyListsItsGpus) {
  // The file's GPUs, as on a real host (they were left out with the file's other I/O devices).
  const std::string xml = std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/topo-2socket-4gpu.xml";
  const ProcessResult r = run_process(shardline_binary() + " topo --xml " + xml + " --np 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::size_t line = r.out.find("gpus: ");
  ASSERT_NE(line, std::string::npos) << r.out;
  const std::string gpus = r.out.substr(line, r.out.find('\n', line) - line);
  for (const char* gpu : {"cuda0", "cuda1", "cuda2", "cuda3", "cuda4"}) {
    EXPECT_NE(gpus.find(gpu), std::string::npos) << gpus;
  }
}

TEST_F(Placement, TopoBadInputIsOneLine) {
  struct Case {
    std::string args, expect;
    int code = 2;
  };
  std::ofstream(path("bad.xml")) << "<topology><object type=\"Banana\">";
  for (const Case& c : {Case{"--synthetic 'pack:1 numa:1 core:2 pu:1' --np 3 --bind core", "only 2 cores"},
                        Case{"--bind socket", "--bind expects auto, numa, core or none"},
                        // with hwloc's own reason, which it writes only with HWLOC_SYNTHETIC_VERBOSE set
                        Case{"--synthetic 'pack:banana'", "hwloc rejects the synthetic topology 'pack:banana': "},
                        Case{"--synthetic 'pack:2 bogus:4'", "at 'bogus:4'"},
                        // control bytes are escaped, not written to the terminal
                        Case{"--synthetic \"$(printf 'pack:2 \\033[31mX')\"", "topology 'pack:2 \\x1b[31mX': "},
                        // a description of millions of threads ran until killed
                        Case{"--synthetic 'pack:1000 core:1000 pu:10'", "has more than 16384 hardware threads"},
                        Case{"--synthetic '1000 1000 10'", "has more than 16384 hardware threads"},
                        // a description with no core to place a rank on is the flag's fault (2), not a missing resource (4)
                        Case{"--synthetic 'pu:1'", "--synthetic 'pu:1': the topology (synthetic 'pu:1') has no NUMA node with a usable core"},
                        Case{"--xml /nonexistent/t.xml", "cannot open topology XML", 4},
                        Case{"--xml " + path("bad.xml"), "topology XML", 3},
                        Case{"--np 0", "--np 0 is not a rank count from 1 to 32768"},
                        // 2^31 ranks' placements grew in memory without end
                        Case{"--np 2147483647", "--np 2147483647 is not a rank count"}}) {
    const ProcessResult r = run_process(shardline_binary() + " topo " + c.args);
    expect_one_error_line(r, c.code, c.expect);
    EXPECT_TRUE(r.out.empty()) << c.args << ":\n" << r.out;
  }
}

// --- run: placement lines and binding -------------------------------------------------------------------

TEST_F(Placement, VerboseRunPrintsEachRanksHostNodeCoresAndArena) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  const ProcessResult r = run_process(mpirun(2) + golden_run("mini-gqa.bin", "--tp 2 --verbose --bind auto"), 180);
  expect_goldens(r, golden_.goldens, "tp=2 --bind auto");
  const memory::HostTopology host = memory::discover_host_topology(false);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string placement = memory::plan_placement(host, rank, 2, memory::BindMode::kAuto).describe();
    const std::regex line("\\[r" + std::to_string(rank) + " pp0 tp" + std::to_string(rank) + "\\] placement: host " +
                          host.hostname + " \\| local rank " + std::to_string(rank) + " of 2: ([^|]*) \\| arena ([0-9.]+ [KMG]iB) \\((hugetlb 2 MiB|THP 2 MiB|4 KiB), bound to node ([0-9]+)\\)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, line)) << "no placement line for rank " << rank << " in:\n" << r.err;
    EXPECT_EQ(m[1].str().substr(0, placement.size()), placement) << m[1];
    EXPECT_EQ(std::stoi(m[4]), host.nodes_with_cores().front()->os_index);
  }
  EXPECT_NE(r.err.find("KV pool 16 tokens/block"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("memory: arena"), std::string::npos) << r.err;
}

TEST_F(Placement, ALaunchersBindingIsReportedAndKept) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  const ProcessResult r = run_process(mpirun(2, "core") + golden_run("mini-gqa.bin", "--tp 2 --verbose --bind core"), 180);
  expect_goldens(r, golden_.goldens, "mpirun --bind-to core");
  EXPECT_NE(r.err.find("keeping that binding"), std::string::npos) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::regex line("\\[r" + std::to_string(rank) + " pp0 tp" + std::to_string(rank) +
                          "\\] placement: [^\\n]*bound by the launcher \\(kept\\)");
    EXPECT_TRUE(std::regex_search(r.err, line)) << "rank " << rank << ":\n" << r.err;
  }
}

TEST_F(Placement, BindNoneLeavesTheRanksAlone) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  const ProcessResult r = run_process(mpirun(2) + golden_run("mini-gqa.bin", "--tp 2 --verbose --bind none"), 180);
  expect_goldens(r, golden_.goldens, "--bind none");
  EXPECT_NE(r.err.find("local rank 0 of 2: not bound (--bind none)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not bound to a node"), std::string::npos) << r.err;
}

// --- run: arena tiers -----------------------------------------------------------------------------------

TEST_F(Placement, ArenaTiersAreChosenAndReported) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  REQUIRE_HUGEPAGE_CONTROL();
  struct Tier {
    std::string flag, reported;
  };
  {
    // Weights copied into the arena (34 MiB for mini-gqa): enough 2 MiB pages for them and the scratch.
    HugepagePool pool(32, HugepagePool::Change::kAdd);
    ASSERT_GE(pool.obtained(), pool.old_pages() + 32) << "the kernel granted only " << pool.obtained() - pool.old_pages()
                                                      << " of 32 hugepages (memory too fragmented)";
    for (const Tier& t : {Tier{"hugetlb", "(hugetlb 2 MiB, bound to node"}, Tier{"auto", "(hugetlb 2 MiB, bound to node"},
                          Tier{"thp", "(THP 2 MiB, bound to node"}, Tier{"4k", "(4 KiB, bound to node"}}) {
      const ProcessResult r = run_process(golden_run("mini-gqa.bin", "--verbose --weights arena --arena-pages " + t.flag), 120);
      expect_goldens(r, golden_.goldens, "--arena-pages " + t.flag);
      EXPECT_NE(r.err.find(t.reported), std::string::npos) << "--arena-pages " << t.flag << ":\n" << r.err;
    }
  }
  {
    HugepagePool none(0);
    const ProcessResult forced = run_process(golden_run("mini-gqa.bin", "--arena-pages hugetlb"), 60);
    expect_one_error_line(forced, 4, "nr_hugepages");
    EXPECT_TRUE(forced.out.empty()) << forced.out;
    const ProcessResult fallback = run_process(golden_run("mini-gqa.bin", "--verbose"), 60);
    expect_goldens(fallback, golden_.goldens, "auto without hugepages");
    EXPECT_NE(fallback.err.find("THP 2 MiB"), std::string::npos) << fallback.err;
    EXPECT_NE(fallback.err.find("no hugetlb: 0 free 2 MiB hugepages"), std::string::npos) << fallback.err;
  }
}

// --- run: KV pool ---------------------------------------------------------------------------------------

TEST_F(Placement, ATooSmallKvPoolIsOneErrorLineBeforeAnyWork) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  // "Once upon a time": 5 prompt tokens + 63 = 68 positions = 5 blocks of 16.
  const std::string args = " run --model " + model_file("mini-gqa.bin") + " --tokenizer " + model_file("tokenizer.bin") +
                           " --prompt 'Once upon a time' --steps 64";
  const ProcessResult one = run_process(shardline_binary() + args + " --kv-blocks 4", 60);
  expect_one_error_line(one, 4, "pass --kv-blocks 5 or more");
  EXPECT_TRUE(one.out.empty()) << one.out;
  const ProcessResult two = run_process(mpirun(2) + shardline_binary() + args + " --kv-blocks 4 --tp 1 --pp 2", 60);
  expect_one_error_line(two, 4, "pass --kv-blocks 5 or more");
  const ProcessResult fits = run_process(shardline_binary() + args + " --kv-blocks 5 --json", 60);
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
}

TEST_F(Placement, SequencesBeyondTheKvPoolWaitAndStillReproduceTheGoldens) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  // Each golden needs at most 5 blocks of 16 positions; 10 blocks hold two of the four at once, so the
  // others start only when a finished sequence's blocks are back on every stage (pp = 3: the release
  // crosses two stage boundaries).
  const struct {
    int ranks;
    std::string layout;
  } runs[] = {{2, "--pp 2 --micro-batches 2"}, {3, "--pp 3"}, {4, "--tp 2 --pp 2 --micro-batches 2"}};
  for (const auto& [ranks, layout] : runs) {
    const ProcessResult r = run_process(mpirun(ranks) + golden_run("tiny-32k.bin", layout + " --kv-blocks 10"), 240);
    expect_goldens(r, golden_.goldens, layout);  // a stage whose pool overflowed would have failed the job
    EXPECT_NE(r.err.find("cannot hold all 4 sequences at their longest"), std::string::npos) << r.err;
  }
}

TEST_F(Placement, PagedAndArenaLayoutsReproduceTheGoldensUnderMpirun) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  for (const std::string extra : {"--kv-block-tokens 3 --weights arena", "--kv-block-tokens 1 --micro-batches 3 --chunk-tokens 5"}) {
    const ProcessResult r = run_process(mpirun(4) + golden_run("tiny-32k.bin", "--tp 2 --pp 2 " + extra), 240);
    expect_goldens(r, golden_.goldens, "tp=2 pp=2 " + extra);
  }
}

}  // namespace
}  // namespace shardline::test
