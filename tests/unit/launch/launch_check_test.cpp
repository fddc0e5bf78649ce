// The launch preflight's rules: rank count, Slurm allocation, hostfile slots, rankfile coverage, and the
// rank -> host map it reports.
#include "launch/launch_check.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/process.h"

namespace shardline::launch {
namespace {

LaunchRequest layout(int tp, int pp) {
  LaunchRequest r;
  r.tp_size = tp;
  r.pp_size = pp;
  return r;
}

template <typename E>
std::string error_of(const LaunchRequest& r) {
  try {
    check_launch(r);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    std::string message = "wrong exception type: ";
    message += e.what();
    return message;
  }
  return "(no error)";
}

SlurmAllocation allocation(int n_tasks, std::vector<int> per_node) {
  SlurmAllocation s;
  s.job_id = std::to_string(9);  // (a literal here trips GCC 12's bogus -Wrestrict)
  s.n_tasks = n_tasks;
  s.tasks_per_node = std::move(per_node);
  s.n_nodes = static_cast<int>(s.tasks_per_node.size());
  return s;
}

TEST(LaunchCheck, LayoutAloneIsFine) {
  const auto report = check_launch(layout(2, 2));
  EXPECT_EQ(report.n_ranks, 4);
  EXPECT_TRUE(report.rank_hosts.empty());
  EXPECT_EQ(report.summary(2, 2), "tp=2 x pp=2 = 4 ranks");
}

TEST(LaunchCheck, RankCountMustEqualTheLayout) {
  LaunchRequest r = layout(2, 1);
  r.n_ranks = 2;
  EXPECT_NO_THROW(check_launch(r));
  r.n_ranks = 4;
  EXPECT_EQ(error_of<ConfigError>(r), "--np 4 starts 4 ranks but tp=2 x pp=1 uses 2: the extra ranks would hold no "
                                      "shard; launch exactly 2 (mpirun -np 2) or raise --tp/--pp");
  r.n_ranks = 1;
  EXPECT_NE(error_of<ResourceError>(r).find("--np 1 starts 1 rank but tp=2 x pp=1 needs 2"), std::string::npos);
  EXPECT_NE(error_of<ConfigError>(layout(0, 1)).find("--tp and --pp must be >= 1"), std::string::npos);
  // A product past an int once wrapped: 65536 x 65536 read as 0 ranks and passed.
  EXPECT_EQ(error_of<ConfigError>(layout(65536, 65536)), "tp=65536 x pp=65536 is more ranks than a job can hold");
}

TEST(LaunchCheck, SlurmAllocationTooSmallIsAResourceError) {
  LaunchRequest r = layout(2, 2);
  r.slurm = allocation(2, {2});
  EXPECT_NE(error_of<ResourceError>(r).find("job 9 has 2 tasks (SLURM_NTASKS) but tp=2 x pp=2 needs 4 ranks, one per "
                                            "task: submit with --ntasks=4"),
            std::string::npos)
      << error_of<ResourceError>(r);
}

TEST(LaunchCheck, SlurmAllocationLargerThanTheLayout) {
  LaunchRequest r = layout(2, 1);
  r.slurm = allocation(4, {2, 2});
  EXPECT_NE(error_of<ConfigError>(r).find("job 9 has 4 tasks but tp=2 x pp=1 uses 2: srun starts one rank per task"),
            std::string::npos);
  r.n_ranks = 2;  // srun -n 2 inside the larger allocation: fine
  EXPECT_NO_THROW(check_launch(r));
}

TEST(LaunchCheck, SlurmBlockDistributionMapsRanksToNodes) {
  LaunchRequest r = layout(2, 2);
  r.slurm = allocation(4, {2, 2});
  const auto report = check_launch(r);
  EXPECT_EQ(report.rank_hosts, (std::vector<std::string>{"node 0", "node 0", "node 1", "node 1"}));
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_EQ(report.summary(2, 2), "tp=2 x pp=2 = 4 ranks: node 0 ranks 0-1, node 1 ranks 2-3");
  r.slurm = allocation(4, {1, 1, 1, 1});
  EXPECT_EQ(check_launch(r).warnings.size(), 2u);  // both TP groups span two nodes
}

TEST(LaunchCheck, TheSummaryOfAThousandHostsKeepsTheFirstRangesAndTheLast) {
  LaunchCheckReport report;
  for (int host = 0; host < 1000; ++host) {
    report.rank_hosts.insert(report.rank_hosts.end(), 2, fmt::format("n{}", host));
  }
  report.n_ranks = 2000;
  EXPECT_EQ(report.summary(2, 1000), "tp=2 x pp=1000 = 2000 ranks: n0 ranks 0-1, n1 ranks 2-3, n2 ranks 4-5, n3 ranks "
                                     "6-7, n4 ranks 8-9, n5 ranks 10-11, ... 993 more ranges ..., n999 ranks 1998-1999");
  report.rank_hosts.resize(16);  // eight ranges: all of them
  EXPECT_EQ(test::count_of(report.summary(2, 8), " ranks "), 8u) << report.summary(2, 8);
  EXPECT_EQ(report.summary(2, 8).find("more"), std::string::npos);
}

TEST(LaunchCheck, HostfileSlots) {
  LaunchRequest r = layout(2, 2);
  r.hostfile = parse_hostfile("a slots=2\nb slots=2\n", "hosts");
  const auto report = check_launch(r);
  EXPECT_EQ(report.summary(2, 2), "tp=2 x pp=2 = 4 ranks: a ranks 0-1, b ranks 2-3");
  EXPECT_TRUE(report.warnings.empty());

  r.hostfile = parse_hostfile("a slots=1\nb slots=2\n", "hosts");
  EXPECT_EQ(error_of<ResourceError>(r),
            "hostfile hosts offers 3 slots (a:1, b:2) but tp=2 x pp=2 needs 4 ranks: raise slots= (one per rank a "
            "host may run), add hosts, or allow --oversubscribe here and in mpirun");
  r.oversubscribe = true;
  EXPECT_NO_THROW(check_launch(r));
  r.hostfile = parse_hostfile("a slots=1 max_slots=1\nb slots=2 max_slots=2\n", "hosts");
  EXPECT_NE(error_of<ResourceError>(r).find("allows at most 3 ranks (max_slots)"), std::string::npos);
}

TEST(LaunchCheck, HostfileThatSplitsATpGroupWarns) {
  LaunchRequest r = layout(2, 2);
  r.hostfile = parse_hostfile("a slots=1\nb slots=2\nc slots=1\n", "hosts");
  const auto report = check_launch(r);
  EXPECT_EQ(report.rank_hosts, (std::vector<std::string>{"a", "b", "b", "c"}));
  ASSERT_EQ(report.warnings.size(), 2u);
  EXPECT_NE(report.warnings[0].find("the TP group of stage 0 (ranks 0-1) spans a, b"), std::string::npos);
}

TEST(LaunchCheck, HostfileWithUnknownSlotsIsNotJudged) {
  LaunchRequest r = layout(4, 2);
  r.hostfile = parse_hostfile("a\nb slots=1\n", "hosts");
  const auto report = check_launch(r);
  EXPECT_TRUE(report.rank_hosts.empty());
  // ... and says so, instead of a bare "ok".
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("hostfile hosts: 'a' gives no slots="), std::string::npos) << report.warnings[0];
  EXPECT_NE(report.warnings[0].find("whether the 8 ranks fit is not checked"), std::string::npos) << report.warnings[0];
}

TEST(LaunchCheck, RankfileMustPlaceEveryRankOnAKnownHost) {
  LaunchRequest r = layout(2, 1);
  r.hostfile = parse_hostfile("a slots=2\nb slots=2\n", "hosts");
  r.rankfile = parse_rankfile("rank 0=a slot=0\nrank 1=+n1 slot=0\n", "ranks");
  EXPECT_EQ(check_launch(r).rank_hosts, (std::vector<std::string>{"a", "b"}));

  r.rankfile = parse_rankfile("rank 0=a slot=0\n", "ranks");
  EXPECT_NE(error_of<ConfigError>(r).find("the rankfile places no rank 1: give one line for each of ranks 0-1"),
            std::string::npos);
  r.rankfile = parse_rankfile("rank 0=a slot=0\nrank 1=a slot=1\nrank 2=b slot=0\n", "ranks");
  EXPECT_NE(error_of<ConfigError>(r).find("rankfile line 3 places rank 2 but tp=2 x pp=1 uses ranks 0-1"),
            std::string::npos);
  r.rankfile = parse_rankfile("rank 0=a slot=0\nrank 1=c slot=0\n", "ranks");
  EXPECT_NE(error_of<ConfigError>(r).find("rankfile line 2 places rank 1 on 'c', which hostfile hosts does not list"),
            std::string::npos);
  r.rankfile = parse_rankfile("rank 0=a slot=0\nrank 1=+n2 slot=0\n", "ranks");
  EXPECT_NE(error_of<ConfigError>(r).find("rankfile line 2 names +n2 but hostfile hosts lists 2 hosts"),
            std::string::npos);
}

// The examples in hostfiles/ are what users copy: each must pass the check its own comment shows.
TEST(LaunchCheck, RankfileIsNotHeldToTheHostfileSlotsButSharedCoresWarn) {
  // mpirun --rankfile starts 4 ranks on a host of 2 slots (Open MPI 4.1): the rankfile decides.
  LaunchRequest r = layout(4, 1);
  r.hostfile = parse_hostfile("a slots=2\n", "hosts");
  r.rankfile = parse_rankfile("rank 0=a slot=0\nrank 1=a slot=1\nrank 2=a slot=2\nrank 3=a slot=3\n", "ranks");
  LaunchCheckReport report = check_launch(r);
  EXPECT_EQ(report.rank_hosts, (std::vector<std::string>(4, "a")));
  EXPECT_TRUE(report.warnings.empty());
  // Overlapping slots on one host warn, in each of mpirun's forms; the same cores on two hosts do not.
  r = layout(2, 2);  // a TP group per host: no other warning
  r.hostfile = parse_hostfile("a slots=4\nb slots=4\n", "hosts");
  r.rankfile = parse_rankfile("rank 0=a slot=0-3\nrank 1=a slot=2\nrank 2=b slot=1:0,1\nrank 3=b slot=1:1\n", "ranks");
  report = check_launch(r);
  ASSERT_EQ(report.warnings.size(), 2u);
  EXPECT_NE(report.warnings[0].find("rankfile lines 1 and 2 bind ranks 0 and 1 to the same cores of a"), std::string::npos)
      << report.warnings[0];
  EXPECT_NE(report.warnings[1].find("ranks 2 and 3"), std::string::npos) << report.warnings[1];
  r.rankfile = parse_rankfile("rank 0=a slot=0\nrank 1=a slot=1:0\nrank 2=b slot=0\nrank 3=b slot=0:1\n", "ranks");
  EXPECT_TRUE(check_launch(r).warnings.empty());
}

// A fuzzing pass: 300 rank lines all bound to cores 0-4095 of one host compared every pair of lines' core
// sets (minutes, then the OOM killer); each pair is now found once through the cores, and the warnings stop
// after eight pairs with the count of the rest.
TEST(LaunchCheck, ManyRankLinesOnTheSameCoresWarnBriefly) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += fmt::format("rank {}=a slot=0:0-4095\n", i);
  LaunchRequest r = layout(300, 1);
  r.rankfile = parse_rankfile(text, "ranks");
  const LaunchCheckReport report = check_launch(r);
  ASSERT_EQ(report.warnings.size(), 9u);
  EXPECT_NE(report.warnings[0].find("rankfile lines 1 and 2 bind ranks 0 and 1 to the same cores of a"),
            std::string::npos) << report.warnings[0];
  EXPECT_EQ(report.warnings[8], "... and 291 more pairs of rankfile lines that share cores");
}

// Slot totals add up in 64 bits: 2200 hosts of max_slots=999999 said "allows at most -2094969496 ranks".
TEST(LaunchCheck, LargeHostfilesCountTheirSlotsWithoutOverflow) {
  std::string text;
  for (int i = 0; i < 2200; ++i) text += fmt::format("h{} slots=1 max_slots=999999\n", i);
  LaunchRequest r = layout(4096, 8);
  r.hostfile = parse_hostfile(text, "hosts");
  r.oversubscribe = true;
  EXPECT_NO_THROW(check_launch(r));
  r.oversubscribe = false;
  try {
    check_launch(r);
    ADD_FAILURE() << "2200 slots taken for 32768 ranks";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("offers 2200 slots (h0:1, h1:1, h2:1, h3:1, h4:1, h5:1, h6:1, h7:1 and 2192 "
                                         "more hosts) but tp=4096 x pp=8 needs 32768 ranks"),
              std::string::npos) << e.what();
  }
}

TEST(LaunchCheck, ExampleFilesPassTheirOwnCheck) {
  const std::string dir = std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/";
  for (const char* name : {"two-hosts.hostfile", "numa.hostfile"}) {
    LaunchRequest r = layout(2, 2);
    r.n_ranks = 4;
    r.hostfile = read_hostfile(dir + name);
    const auto report = check_launch(r);
    EXPECT_EQ(report.summary(2, 2), "tp=2 x pp=2 = 4 ranks: node01 ranks 0-1, node02 ranks 2-3") << name;
    EXPECT_TRUE(report.warnings.empty()) << name;
  }
  LaunchRequest r = layout(2, 2);
  r.hostfile = read_hostfile(dir + "two-hosts.hostfile");
  r.rankfile = read_rankfile(dir + "tp2-pp2.rankfile");
  EXPECT_EQ(check_launch(r).rank_hosts, (std::vector<std::string>{"node01", "node01", "node02", "node02"}));
}

}  // namespace
}  // namespace shardline::launch
