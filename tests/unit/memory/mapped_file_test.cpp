#include <numaif.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "memory/binding.h"
#include "memory/mapped_file.h"
#include "memory/system_memory.h"
#include "memory/topology.h"

namespace shardline::memory {
namespace {

std::string write_temp(const std::vector<float>& values) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mapped_file_test_" + std::to_string(::getpid()) + ".bin")).string();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return path;
}

TEST(MappedFile, MapsUnalignedRangesZeroCopy) {
  std::vector<float> values(5000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const std::string path = write_temp(values);
  MappedFile file(path);
  EXPECT_EQ(file.size_bytes(), values.size() * sizeof(float));
  // Offset 1234 floats is not page aligned: the region must still start at exactly that value.
  MappedRegion region = file.map(1234 * sizeof(float), 100 * sizeof(float));
  ASSERT_EQ(region.size_bytes(), 100 * sizeof(float));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(region.as<float>()[i], 1234.0f + i);
  MappedRegion moved = std::move(region);
  EXPECT_EQ(moved.as<float>()[0], 1234.0f);
  EXPECT_EQ(region.data(), nullptr);
  float head[2];
  file.read(4, head, sizeof(head));
  EXPECT_EQ(head[0], 1.0f);
  EXPECT_EQ(head[1], 2.0f);
  std::filesystem::remove(path);
}

TEST(MappedFile, ErrorsNameThePath) {
  try {
    MappedFile missing("/nonexistent/model.bin");
    FAIL();
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.bin"), std::string::npos);
  }
  const std::string path = write_temp(std::vector<float>(10));
  MappedFile file(path);
  EXPECT_THROW(file.map(8 * sizeof(float), 3 * sizeof(float)), FormatError);
  float buf[4];
  EXPECT_THROW(file.read(36, buf, sizeof(buf)), FormatError);
  std::filesystem::remove(path);
}

TEST(MappedFile, AFileCutShortAfterOpeningIsTruncatedNotFailedSuccess) {
  // pread() returning 0 (the file shrank since it was opened: overwritten during a load) left errno as it was:
  // "reading '...' failed: Success", exit 4. It is a truncated file, named with its sizes.
  const std::string path = write_temp(std::vector<float>(1000));
  MappedFile file(path);
  std::filesystem::resize_file(path, 100);
  std::vector<float> buf(500);
  for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{3000}}) {  // from before the new end and past it
    try {
      file.read(offset, buf.data(), 200);
      FAIL() << "read past the new end from " << offset;
    } catch (const FormatError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path + "' is truncated: it had 4000 bytes when opened and has 100 bytes now"),
                std::string::npos) << what;
    }
  }
  std::filesystem::remove(path);
}

// Weight ranges: populated up front (resident before the first read) and bound to the rank's node.
TEST(MappedFile, PopulatedRangesAreResidentAndBoundToTheNode) {
  std::vector<float> values(512 * 1024);  // 2 MiB
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000);
  const std::string path = write_temp(values);
  const int node = discover_host_topology(false).nodes_with_cores().front()->os_index;
  MappedFile file(path);
  MappedRegion region = file.map(4096, 1 << 20, {.populate = true, .numa_node = node});
  EXPECT_GE(backing_of(region.data(), region.size_bytes()).resident_bytes, region.size_bytes());
  const RangePolicy policy = range_policy(region.data());
  EXPECT_EQ(policy.mode, MPOL_BIND);
  EXPECT_EQ(policy.nodes, std::vector<int>{node});
  EXPECT_EQ(node_of_page(region.data()), node);
  EXPECT_EQ(region.as<float>()[10], 34.0f);  // float 1034 of the file, values cycle every 1000
  MappedRegion lazy = file.map(0, 4096, {.populate = false});
  EXPECT_EQ(range_policy(lazy.data()).mode, MPOL_DEFAULT);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace shardline::memory
