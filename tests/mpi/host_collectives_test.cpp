// The shared-memory collectives (comm/host_collectives.h) under real `mpirun --oversubscribe` (2 and 3 ranks
// on this host, so ranks may outnumber cores and the waits must yield). What they must get right:
//  - all-reduce: every rank gets the sum in rank order, bit for bit, on every rank, for sizes from one float
//    to several slots (rounds), call after call (the two slots alternate: a rank that runs ahead must not
//    overwrite data a slower one still reads; a one-slot version fails every run);
//  - the segment is mapped once per group and its name never stays in /dev/shm;
//  - all-gather (floats and bytes): every rank's part in rank order, uneven and empty parts, parts longer
//    than a slot;
//  - a rank that never arrives: a CommError naming it after the timeout, never a hang;
//  - ordered_sum: each rank's parts added onto the sum of the ranks before it, in order (both paths);
//  - MpiCommunicator with host_collectives uses them (same bits as the direct calls) and without them
//    agrees with MPI's own sums within rounding (bit for bit on 2 ranks: a + b = b + a).
// The fallback to MPI when a group spans hosts runs in tests/multihost (tp=2 across two network
// namespaces, whose partial sums must cross the veth).
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/host_collectives.h"
#include "comm/mpi_communicator.h"
#include "common/error.h"
#include "tests/support/mpi_world.h"

namespace shardline::comm {
namespace {

using test::world_rank;
using test::world_size;

constexpr std::size_t kSlotFloats = HostCollectives::kSlotBytes / sizeof(float);

// Rank r's values for call `call`: floats of mixed magnitudes, so the order of the additions shows in the bits.
std::vector<float> values(int rank, int call, std::size_t count) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000 * call + rank));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(count);
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  return v;
}

// What every rank must get: the ranks' values added in rank order.
std::vector<float> rank_order_sum(int call, std::size_t count) {
  std::vector<float> sum = values(0, call, count);
  for (int r = 1; r < world_size(); ++r) {
    const std::vector<float> v = values(r, call, count);
    for (std::size_t i = 0; i < count; ++i) sum[i] += v[i];
  }
  return sum;
}

// Whether every rank holds the same bytes.
bool same_on_every_rank(const std::vector<float>& v) {
  std::vector<float> first(v);
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::memcmp(first.data(), v.data(), v.size() * sizeof(float)) == 0 ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Shared-memory mappings of this process whose name is one of ours (they stay in /proc/self/maps, marked
// "(deleted)", after the name is unlinked).
int our_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("/shardline-") != std::string::npos;
  return n;
}

// Names in /dev/shm that rank 0 of this job created (its pid is in them).
int names_left_in_dev_shm() {
  int pid = static_cast<int>(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string prefix = "shardline-" + std::to_string(pid) + "-";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    n += entry.path().filename().string().rfind(prefix, 0) == 0;
  }
  return n;
}

TEST(HostCollectives, AllRanksOfThisHostGetASegmentAndNoNameStays) {
  ASSERT_GE(world_size(), 2) << "run under mpirun -np 2 or more";
  const int before = our_mappings();
  auto host = HostCollectives::create(MPI_COMM_WORLD, 60.0);
  EXPECT_NE(host, nullptr) << "every rank of this job shares this host";
  EXPECT_EQ(our_mappings(), before + 1);
  EXPECT_EQ(names_left_in_dev_shm(), 0) << "the segment's name is unlinked once every rank has mapped it";
  host.reset();
  EXPECT_EQ(our_mappings(), before);
}

// Many calls back to back, each rank pausing a different, varying time before some of them, checked on
// each rank alone and compared across ranks only at the end: a rank that runs ahead writes its slot for
// the next call while slower ones still read this one's, which only the second slot keeps apart.
TEST(HostCollectives, RanksRunningAheadNeverOverwriteWhatOthersStillRead) {
  auto host = HostCollectives::create(MPI_COMM_WORLD, 60.0);
  ASSERT_NE(host, nullptr);
  const std::size_t count = 3000;
  std::vector<float> all_results;
  int wrong = 0;
  for (int call = 0; call < 200; ++call) {
    if ((call + world_rank()) % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * (world_rank() + 1)));
    std::vector<float> data = values(world_rank(), 2000 + call, count);
    host->all_reduce_sum(data.data(), count);
    const std::vector<float> want = rank_order_sum(2000 + call, count);
    wrong += std::memcmp(data.data(), want.data(), count * sizeof(float)) != 0;
    all_results.insert(all_results.end(), data.begin(), data.begin() + 8);
  }
  EXPECT_EQ(wrong, 0) << "calls whose sum was not the rank-order sum";
  EXPECT_TRUE(same_on_every_rank(all_results));
}

TEST(HostCollectives, AllReduceIsTheRankOrderSumOnEveryRankCallAfterCall) {
  auto host = HostCollectives::create(MPI_COMM_WORLD, 60.0);
  ASSERT_NE(host, nullptr);
  // One float, a partial slot, the 110M batch-16 activations, exactly a slot, and rounds with a remainder;
  // then many small calls in a row, which run the two slots through their reuse.
  std::vector<std::size_t> counts = {1, 1000, 16 * 768, kSlotFloats, 2 * kSlotFloats + 5};
  for (int i = 0; i < 60; ++i) counts.push_back(static_cast<std::size_t>(1 + 37 * i));
  for (std::size_t c = 0; c < counts.size(); ++c) {
    const int call = static_cast<int>(c);
    std::vector<float> data = values(world_rank(), call, counts[c]);
    host->all_reduce_sum(data.data(), data.size());
    const std::vector<float> want = rank_order_sum(call, counts[c]);
    ASSERT_EQ(0, std::memcmp(data.data(), want.data(), want.size() * sizeof(float)))
        << "count " << counts[c] << ", call " << call;
    ASSERT_TRUE(same_on_every_rank(data)) << "count " << counts[c];
  }
}

TEST(HostCollectives, AllGatherPutsEveryPartInRankOrder) {
  auto host = HostCollectives::create(MPI_COMM_WORLD, 60.0);
  ASSERT_NE(host, nullptr);
  // Uneven parts (the vocabulary's TP slices), an empty part, and parts longer than a slot.
  const std::vector<std::vector<int>> cases = {
      {5, 3, 0}, {1000, 1001, 999}, {0, static_cast<int>(kSlotFloats) + 7, 12}, {2 * static_cast<int>(kSlotFloats), 1, 3}};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const std::vector<int> counts(cases[c].begin(), cases[c].begin() + world_size());
    std::vector<float> want;
    for (int r = 0; r < world_size(); ++r) {
      const std::vector<float> part = values(r, 500 + static_cast<int>(c), counts[r]);
      want.insert(want.end(), part.begin(), part.end());
    }
    const std::vector<float> mine = values(world_rank(), 500 + static_cast<int>(c), counts[world_rank()]);
    std::vector<float> got(want.size() + 1, -7.0f);  // one guard past the end
    host->all_gather_v(mine.data(), got.data(), counts);
    EXPECT_EQ(got.back(), -7.0f) << "wrote past the parts, case " << c;
    got.pop_back();
    EXPECT_EQ(got, want) << "case " << c;
  }
}

TEST(HostCollectives, AllGatherBytesPutsEveryRanksBytesInRankOrder) {
  auto host = HostCollectives::create(MPI_COMM_WORLD, 60.0);
  ASSERT_NE(host, nullptr);
  // A few bytes (the greedy picks' value and index), an odd count, none, and more than a slot.
  for (const std::size_t bytes : {std::size_t{12}, std::size_t{1001}, std::size_t{0}, HostCollectives::kSlotBytes + 5}) {
    std::vector<unsigned char> want, mine;
    for (int r = 0; r < world_size(); ++r) {
      for (std::size_t i = 0; i < bytes; ++i) {
        const auto byte = static_cast<unsigned char>((i * 7 + static_cast<std::size_t>(r) * 31 + bytes) & 0xff);
        want.push_back(byte);
        if (r == world_rank()) mine.push_back(byte);
      }
    }
    std::vector<unsigned char> got(want.size() + 1, 0xa5);  // one guard past the end
    host->all_gather_bytes(mine.data(), bytes, got.data());
    EXPECT_EQ(got.back(), 0xa5) << "wrote past the parts, " << bytes << " bytes each";
    got.pop_back();
    EXPECT_EQ(got, want) << bytes << " bytes each";
  }
}

// ordered_sum (tensor parallelism's sums in segment order): rank 0's values, then each rank's parts added
// onto the sum in order, element by element; on the shared-memory path (slots, rounds, calls back to back
// with ranks running ahead) and on MPI's send, recv and broadcast, with the same bits on every rank.
TEST(HostCollectives, OrderedSumAddsEachRanksPartsInRankOrder) {
  std::vector<int> everyone(world_size());
  for (int r = 0; r < world_size(); ++r) everyone[r] = r;
  const auto host = make_mpi_group(everyone, {.timeout_s = 60.0, .host_collectives = true});
  const auto mpi = make_mpi_group(everyone, {.timeout_s = 60.0});
  constexpr int kParts = 3;  // each rank's values come in three parts, added one after the other
  auto part = [](int rank, int p, int call, std::size_t count) { return values(rank * 10 + p, call, count); };
  for (Communicator* comm : {host.get(), mpi.get()}) {
    int wrong = 0;
    for (int call = 0; call < 40; ++call) {
      const std::size_t count = call == 0 ? 2 * kSlotFloats + 9 : static_cast<std::size_t>(1 + 97 * call);
      if ((call + world_rank()) % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(40 * (world_rank() + 1)));
      std::vector<float> want = part(0, 0, call, count);
      for (int r = 0; r < world_size(); ++r) {
        for (int p = r == 0 ? 1 : 0; p < kParts; ++p) {
          const std::vector<float> v = part(r, p, call, count);
          for (std::size_t i = 0; i < count; ++i) want[i] += v[i];
        }
      }
      // Rank 0 brings its parts already added (as its tiles fold them); the others add theirs when called.
      std::vector<float> data(count, 0.0f);
      if (world_rank() == 0) {
        data = part(0, 0, call, count);
        for (int p = 1; p < kParts; ++p) {
          const std::vector<float> v = part(0, p, call, count);
          for (std::size_t i = 0; i < count; ++i) data[i] += v[i];
        }
      }
      std::vector<std::vector<float>> mine;
      for (int p = 0; p < kParts; ++p) mine.push_back(part(world_rank(), p, call, count));
      comm->ordered_sum(data.data(), count, [&](float* y, std::size_t offset, std::size_t n) {
        for (const auto& v : mine) {
          for (std::size_t i = 0; i < n; ++i) y[i] += v[offset + i];
        }
      });
      wrong += std::memcmp(data.data(), want.data(), count * sizeof(float)) != 0;
    }
    EXPECT_EQ(wrong, 0) << (comm == host.get() ? "shared memory" : "MPI") << ": calls whose sum was not in rank order";
  }
}

TEST(HostCollectives, ARankThatNeverArrivesIsNamedAfterTheTimeout) {
  auto host = HostCollectives::create(MPI_COMM_WORLD, 1.0);
  ASSERT_NE(host, nullptr);
  if (world_rank() == 0) {
    std::vector<float> data(100, 1.0f);
    try {
      host->all_reduce_sum(data.data(), data.size());
      ADD_FAILURE() << "the all-reduce returned without its peers";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("timed out after 1 s (--comm-timeout) waiting for rank 1"), std::string::npos)
          << e.what();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the others never called it; the segment is dropped with `host`
}

TEST(HostCollectives, MpiCommunicatorUsesThemAndAgreesWithMpi) {
  std::vector<int> everyone(world_size());
  for (int r = 0; r < world_size(); ++r) everyone[r] = r;
  const int before = our_mappings();
  const auto host = make_mpi_group(everyone, {.timeout_s = 60.0, .host_collectives = true});
  EXPECT_EQ(our_mappings(), before + 1) << "host_collectives maps a segment";
  const auto mpi = make_mpi_group(everyone, {.timeout_s = 60.0});
  EXPECT_EQ(our_mappings(), before + 1) << "without host_collectives nothing is mapped";
  const std::size_t count = 3 * 768 + 1;
  std::vector<float> a = values(world_rank(), 900, count), b = a;
  host->all_reduce_sum(a.data(), count);
  mpi->all_reduce_sum(b.data(), count);
  const std::vector<float> want = rank_order_sum(900, count);
  EXPECT_EQ(0, std::memcmp(a.data(), want.data(), count * sizeof(float))) << "the shared-memory path's bits";
  std::vector<float> magnitude(count, 0.0f);  // sum of |value| over the ranks: what a rounding is relative to
  for (int r = 0; r < world_size(); ++r) {
    const std::vector<float> v = values(r, 900, count);
    for (std::size_t i = 0; i < count; ++i) magnitude[i] += std::fabs(v[i]);
  }
  for (std::size_t i = 0; i < count; ++i) {
    // Two ranks: a + b = b + a exactly. More: MPI may associate the additions differently, each of the
    // world_size - 1 additions rounding by at most half an ulp of the magnitude, in either order.
    const float tolerance = world_size() == 2 ? 0.0f : (world_size() - 1) * std::ldexp(magnitude[i], -23);
    ASSERT_LE(std::fabs(b[i] - want[i]), tolerance) << "element " << i;
  }
  std::vector<int> counts(world_size());
  for (int r = 0; r < world_size(); ++r) counts[r] = 10 + r;
  const std::vector<float> mine(counts[world_rank()], static_cast<float>(world_rank()));
  std::vector<float> x(10 * world_size() + world_size() * (world_size() - 1) / 2), y(x.size());
  host->all_gather_v(mine.data(), x.data(), counts);
  mpi->all_gather_v(mine.data(), y.data(), counts);
  EXPECT_EQ(x, y);
  const int tag[2] = {world_rank(), 1000 + world_rank()};
  std::vector<int> tags_host(2 * world_size()), tags_mpi(tags_host.size());
  host->all_gather_bytes(tag, sizeof tag, tags_host.data());
  mpi->all_gather_bytes(tag, sizeof tag, tags_mpi.data());
  EXPECT_EQ(tags_host, tags_mpi);
  EXPECT_EQ(tags_host[2 * (world_size() - 1) + 1], 1000 + world_size() - 1);
}

}  // namespace
}  // namespace shardline::comm
