// cgroup_memory_left on cgroup trees written under a temporary folder: v2 and v1 layouts, limits on an
// ancestor, "max" and v1's "unlimited", and the path a cgroup namespace hides.
#include "memory/system_memory.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace shardline::memory {
namespace {

namespace fs = std::filesystem;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("cgroup_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text << "\n";
  }
  fs::path root_;
};

TEST_F(CgroupTree, V2TakesTheLeastLeftOverTheCgroupAndItsAncestors) {
  write("job/memory.max", "1000000");
  write("job/memory.current", "200000");
  write("job/step/memory.max", "max");
  write("job/step/memory.current", "100000");
  EXPECT_EQ(cgroup_memory_left("0::/job/step\n", root_.string()), 800000u);
  write("job/step/memory.max", "500000");  // the step's own limit is tighter
  EXPECT_EQ(cgroup_memory_left("0::/job/step\n", root_.string()), 400000u);
  write("job/memory.current", "1200000");  // over its limit (the kernel reclaims): nothing left, not a wrap
  EXPECT_EQ(cgroup_memory_left("0::/job/step\n", root_.string()), 0u);
}

TEST_F(CgroupTree, NoLimitAnywhereIsNullopt) {
  write("job/memory.max", "max");
  write("job/memory.current", "5");
  EXPECT_FALSE(cgroup_memory_left("0::/job\n", root_.string()));
  write("memory/a/memory.limit_in_bytes", "9223372036854771712");  // v1's "unlimited"
  write("memory/a/memory.usage_in_bytes", "5");
  EXPECT_FALSE(cgroup_memory_left("4:memory:/a\n0::/\n", root_.string()));
  EXPECT_FALSE(cgroup_memory_left("", root_.string()));
}

TEST_F(CgroupTree, V1ReadsTheMemoryControllersLine) {
  write("memory/slurm/uid_0/job_7/memory.limit_in_bytes", "2147483648");
  write("memory/slurm/uid_0/job_7/memory.usage_in_bytes", "1073741824");
  const std::string lines = "9:name=systemd:/\n5:cpu,cpuacct:/slurm/uid_0/job_7\n4:memory:/slurm/uid_0/job_7\n0::/\n";
  EXPECT_EQ(cgroup_memory_left(lines, root_.string()), 1073741824u);
  // Listed with other controllers on one hierarchy.
  EXPECT_EQ(cgroup_memory_left("4:blkio,memory:/slurm/uid_0/job_7\n", root_.string()), 1073741824u);
}

TEST_F(CgroupTree, InsideANamespaceTheMountsRootIsTheCgroup) {
  // /proc/self/cgroup names the path on the host; the container's mount shows its own cgroup as the root.
  write("memory.max", "3000");
  write("memory.current", "1000");
  EXPECT_EQ(cgroup_memory_left("0::/kubepods/pod1/abc\n", root_.string()), 2000u);
}

TEST_F(CgroupTree, InactiveFilePagesAreFreeAsMemAvailableCountsThem) {
  // A job that read its model file: its cache fills the cgroup up to the limit, and the kernel reclaims it.
  write("job/memory.max", "16000");
  write("job/memory.current", "15900");
  std::ofstream(root_ / "job/memory.stat") << "anon 4000\nfile 11900\ninactive_file 10000\nactive_file 1900\n";
  EXPECT_EQ(cgroup_memory_left("0::/job\n", root_.string()), 10100u);
  write("memory/j/memory.limit_in_bytes", "16000");
  write("memory/j/memory.usage_in_bytes", "15900");
  std::ofstream(root_ / "memory/j/memory.stat") << "cache 11900\ninactive_file 3\ntotal_inactive_file 10000\n";
  EXPECT_EQ(cgroup_memory_left("4:memory:/j\n", root_.string()), 10100u);  // v1: the hierarchy's total
}

TEST_F(CgroupTree, TheWalkUpStopsAtTheMountWhateverItsSpelling) {
  write("memory.max", "1000");  // above the mount the tests give: never read
  write("mnt/job/memory.max", "max");
  for (const std::string mount : {"mnt", "mnt/", "mnt//", "./mnt/."}) {
    EXPECT_FALSE(cgroup_memory_left("0::/job\n", (root_ / mount).string())) << mount;
  }
}

TEST(SystemMemory, UsableMemoryIsAtMostTheHostsMemory) {
  const auto usable = usable_memory_bytes();
  ASSERT_TRUE(usable);  // Linux since 3.14 says MemAvailable
  EXPECT_GT(*usable, 0u);
  EXPECT_LE(*usable, read_meminfo().total_bytes);
}

}  // namespace
}  // namespace shardline::memory
