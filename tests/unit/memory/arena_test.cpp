// The arena's page tiers on the real kernel: with 2 MiB hugepages reserved (hugetlb), with none (THP),
// with THP refused by the process (4 KiB), and forced tiers. Each must report the tier it got, be backed by
// that kind of page (checked independently in /proc/self/smaps) and hold what is written to it.
#include <numaif.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "memory/arena.h"
#include "memory/binding.h"
#include "memory/kv_block_pool.h"
#include "memory/system_memory.h"
#include "memory/topology.h"
#include "tests/support/hugepages.h"
#include "tests/support/models.h"

namespace shardline::memory {
namespace {

using test::HugepagePool;

#define REQUIRE_HUGEPAGE_CONTROL()                                                                        \
  do {                                                                                                    \
    if (!HugepagePool::can_change()) {                                                                    \
      if (test::in_ci()) FAIL() << "CI=true but /proc/sys/vm/nr_hugepages is not writable (run as root)"; \
      GTEST_SKIP() << "needs root to set /proc/sys/vm/nr_hugepages";                                      \
    }                                                                                                     \
  } while (0)

int first_node() { return discover_host_topology(false).nodes_with_cores().front()->os_index; }

// Writes a distinct value into every 4 KiB of [p, p + bytes) and reads all of them back.
void expect_memory_works(void* p, std::uint64_t bytes) {
  auto* words = static_cast<std::uint64_t*>(p);
  const std::uint64_t stride = 4096 / sizeof(std::uint64_t);
  const std::uint64_t n = bytes / sizeof(std::uint64_t);
  for (std::uint64_t i = 0; i < n; i += stride) words[i] = i * 2654435761u + 7;
  words[n - 1] = 42;
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i + stride <= n; i += stride) bad += words[i] != i * 2654435761u + 7;
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(words[n - 1], 42u);
}

void expect_bound_to(const void* p, int node) {
  const RangePolicy policy = range_policy(p);
  EXPECT_EQ(policy.mode, MPOL_BIND);
  EXPECT_EQ(policy.nodes, std::vector<int>{node});
  EXPECT_EQ(node_of_page(p), node);
}

using test::ThpRefused;

constexpr std::uint64_t kBytes = 8ull << 20;

TEST(Arena, HugetlbTierWhenPagesAreReserved) {
  REQUIRE_HUGEPAGE_CONTROL();
  const long wanted = static_cast<long>(kBytes / kHugePageBytes);
  HugepagePool pool(wanted, HugepagePool::Change::kAdd);
  ASSERT_GE(read_meminfo().hugepages_free, wanted) << "the kernel granted " << pool.obtained() << " pages";
  const int node = first_node();
  {
    Arena arena({.initial_bytes = kBytes, .numa_node = node});
    EXPECT_EQ(arena.page_kind(), PageKind::kHugetlb) << arena.describe();
    EXPECT_EQ(arena.page_reason(), "");
    EXPECT_TRUE(arena.node_bound());
    void* p = arena.allocate_bytes(kBytes);
    EXPECT_EQ(backing_of(p, kBytes).hugetlb_bytes, kBytes);
    expect_memory_works(p, kBytes);
    expect_bound_to(p, node);
    // Faulted in up front: the pages are taken from the pool now, not at first touch.
    EXPECT_LE(read_meminfo().hugepages_free, pool.obtained() - wanted);
  }
  EXPECT_EQ(HugepagePool::read_pool(), pool.obtained());
}

TEST(Arena, TransparentHugepagesWhenNoneAreReserved) {
  REQUIRE_HUGEPAGE_CONTROL();
  HugepagePool pool(0);
  const std::string mode = transparent_hugepage_mode();
  ASSERT_TRUE(mode == "madvise" || mode == "always") << "this test needs THP enabled; it is '" << mode << "'";
  Arena arena({.initial_bytes = kBytes, .numa_node = first_node()});
  EXPECT_EQ(arena.page_kind(), PageKind::kTransparentHuge) << arena.describe();
  EXPECT_NE(arena.page_reason().find("no hugetlb"), std::string::npos) << arena.page_reason();
  void* p = arena.allocate_bytes(kBytes, kHugePageBytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kHugePageBytes, 0u);
  expect_memory_works(p, kBytes);
  expect_bound_to(p, first_node());
  const Backing backing = backing_of(p, kBytes);
  EXPECT_EQ(backing.hugetlb_bytes, 0u);
  EXPECT_GT(backing.anon_huge_bytes, 0u) << "madvised, populated and 2 MiB aligned, yet no huge page";
}

TEST(Arena, SmallPagesWhenTheProcessRefusesThp) {
  REQUIRE_HUGEPAGE_CONTROL();
  HugepagePool pool(0);
  ThpRefused refused;
  ASSERT_TRUE(refused.refused);
  ASSERT_TRUE(thp_disabled_for_process());
  Arena arena({.initial_bytes = kBytes, .numa_node = first_node()});
  EXPECT_EQ(arena.page_kind(), PageKind::kSmall) << arena.describe();
  EXPECT_NE(arena.page_reason().find("PR_SET_THP_DISABLE"), std::string::npos) << arena.page_reason();
  void* p = arena.allocate_bytes(kBytes);
  expect_memory_works(p, kBytes);
  expect_bound_to(p, first_node());
  const Backing backing = backing_of(p, kBytes);
  EXPECT_EQ(backing.hugetlb_bytes, 0u);
  EXPECT_EQ(backing.anon_huge_bytes, 0u);
  EXPECT_GE(backing.resident_bytes, kBytes);  // populated up front
}

TEST(Arena, ForcedSmallPagesStaySmallEvenWithHugepagesAround) {
  REQUIRE_HUGEPAGE_CONTROL();
  HugepagePool pool(4, HugepagePool::Change::kAdd);
  Arena arena({.initial_bytes = kBytes, .pages = PagePolicy::kSmall});
  EXPECT_EQ(arena.page_kind(), PageKind::kSmall);
  void* p = arena.allocate_bytes(kBytes);
  expect_memory_works(p, kBytes);
  const Backing backing = backing_of(p, kBytes);
  EXPECT_EQ(backing.hugetlb_bytes, 0u);
  EXPECT_EQ(backing.anon_huge_bytes, 0u);
}

TEST(Arena, ForcedHugetlbWithoutPagesIsOneClearError) {
  REQUIRE_HUGEPAGE_CONTROL();
  HugepagePool pool(0);
  try {
    Arena arena({.initial_bytes = kBytes, .pages = PagePolicy::kHugetlb});
    FAIL() << "expected a ResourceError, got " << arena.describe();
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("nr_hugepages"), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), ExitCode::kResource);
  }
}

TEST(Arena, ForcedThpRefusedByTheProcessIsOneClearError) {
  ThpRefused refused;
  EXPECT_THROW(Arena({.initial_bytes = kBytes, .pages = PagePolicy::kTransparentHuge}), ResourceError);
}

TEST(Arena, BumpAllocatesAlignedAndGrowsByChunks) {
  Arena arena({.initial_bytes = 2ull << 20, .growth_bytes = 4ull << 20, .pages = PagePolicy::kSmall});
  EXPECT_EQ(arena.reserved_bytes(), 2ull << 20);
  char* a = static_cast<char*>(arena.allocate_bytes(100, 64));
  char* b = static_cast<char*>(arena.allocate_bytes(100, 256));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 256, 0u);
  EXPECT_GE(b, a + 100);
  // More than the first chunk has left: a second chunk, and both stay valid.
  char* big = static_cast<char*>(arena.allocate_bytes(3ull << 20));
  EXPECT_EQ(arena.n_chunks(), 2);
  EXPECT_TRUE(arena.contains(a) && arena.contains(big) && arena.contains(big + (3ull << 20) - 1));
  std::memset(a, 1, 100);
  std::memset(big, 2, 3ull << 20);
  EXPECT_EQ(a[99], 1);
  EXPECT_EQ(big[(3ull << 20) - 1], 2);
  EXPECT_GE(arena.used_bytes(), 200u + (3ull << 20));
}

TEST(Arena, AlignedOffsetsAlignTheAddressNotTheOffset) {
  // A chunk of 4 KiB pages is only sure to start on a page (kernels before 6.7 put large anonymous maps on
  // any page; newer ones on 2 MiB, where aligning the offset happened to be enough).
  const std::uintptr_t base = (64ull << 20) + 3 * 4096;  // a page, not a 2 MiB boundary
  for (std::uint64_t alignment : {std::uint64_t{64}, std::uint64_t{4096}, std::uint64_t{1} << 20, kHugePageBytes}) {
    for (std::uint64_t used : {std::uint64_t{0}, std::uint64_t{100}, std::uint64_t{5} << 20}) {
      const std::uint64_t at = aligned_offset(base, used, alignment);
      EXPECT_EQ((base + at) % alignment, 0u) << alignment << " " << used;
      EXPECT_GE(at, used);
      EXPECT_LT(at, used + alignment);
    }
  }
}

TEST(Arena, LargeAlignmentsAlignTheAddressNotTheOffset) {
  // The same through the arena, in the first chunk and in a grown one.
  Arena arena({.initial_bytes = 4ull << 20, .growth_bytes = 4ull << 20, .pages = PagePolicy::kSmall});
  for (std::size_t alignment : {std::size_t{4096}, std::size_t{1} << 20, std::size_t{2} << 20}) {
    arena.allocate_bytes(100);  // leaves the next offset unaligned
    for (int i = 0; i < 3; ++i) {  // the third 1 or 2 MiB block no longer fits the chunk: a new chunk
      char* p = static_cast<char*>(arena.allocate_bytes(1000, alignment));
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0u) << alignment;
      EXPECT_TRUE(arena.contains(p) && arena.contains(p + 999)) << alignment;
    }
  }
  EXPECT_GE(arena.n_chunks(), 2);
}

// Lines of /proc/self/maps: one per mapping of this process.
int mapping_count() {
  std::ifstream maps("/proc/self/maps");
  int lines = 0;
  for (std::string line; std::getline(maps, line);) ++lines;
  return lines;
}

TEST(Arena, AFailedBindingUnmapsWhatItMapped) {
  // mbind to a node that does not exist fails (EINVAL) after the chunk was mapped: each tier tried used to
  // throw past its munmap, and every failed arena or KV pool left its mappings behind.
  const int before = mapping_count();
  for (int i = 0; i < 5; ++i) {
    for (PagePolicy pages : {PagePolicy::kAuto, PagePolicy::kSmall}) {
      EXPECT_THROW(Arena({.initial_bytes = 2ull << 20, .numa_node = 999, .pages = pages}), ResourceError);
    }
    EXPECT_THROW(KvBlockPool({.block_bytes = 64 << 10, .n_blocks = 4, .numa_node = 999}), ResourceError);
  }
  EXPECT_EQ(mapping_count(), before);
}

TEST(Arena, ArraysAreZeroFilled) {
  Arena arena({.pages = PagePolicy::kSmall});
  ArenaArray<float> values = arena.allocate_array<float>(1000);
  ASSERT_EQ(values.size(), 1000u);
  for (float v : values) ASSERT_EQ(v, 0.0f);
  values[999] = 3.0f;
  EXPECT_EQ(values.data()[999], 3.0f);
}

TEST(Arena, PolicyNamesParse) {
  EXPECT_EQ(parse_page_policy("auto"), PagePolicy::kAuto);
  EXPECT_EQ(parse_page_policy("hugetlb"), PagePolicy::kHugetlb);
  EXPECT_EQ(parse_page_policy("thp"), PagePolicy::kTransparentHuge);
  EXPECT_EQ(parse_page_policy("4k"), PagePolicy::kSmall);
  EXPECT_THROW(parse_page_policy("1g"), ConfigError);
}

}  // namespace
}  // namespace shardline::memory
