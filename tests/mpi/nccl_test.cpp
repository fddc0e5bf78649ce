// The NCCL communicator under real `mpirun -np 2 --oversubscribe` (labels cuda, mpi).
// - NcclSetUp runs everywhere, GPU or not: a rank that cannot use its device fails set-up with
//   ResourceError on every rank (never a hang in ncclCommInitRank). On this CI machine (no driver) that
//   is the "no GPU" path; on a GPU machine, a device index that does not exist.
// - NcclCollectives.StreamOrdered*: the CUDA stage's all-reduce (start on the communication stream, join on
//   the compute stream, no host wait in between): two all-reduces in flight while compute runs, the same
//   sequence captured in a CUDA graph and replayed, and a peer that never joins ending in CommError at
//   synchronize() within the timeout.
// - NcclCollectives needs one GPU per rank on the node and skips itself with the reason otherwise: every
//   operation of the Communicator interface on device buffers, and a peer that never joins an all-reduce
//   ending in CommError and an abort within the timeout instead of a hang. It also runs as a one-rank job,
//   so a one-GPU machine still checks the bootstrap and the collectives' plumbing.
#include <mpi.h>

#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/nccl_communicator.h"
#include "common/error.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/ops.h"
#include "tests/support/mpi_world.h"

namespace shardline::comm {
namespace {

namespace cuda = kernels::cuda;

using test::world_rank;
using test::world_size;
std::vector<int> world_ranks() {
  std::vector<int> ranks(world_size());
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

TEST(NcclSetUp, ARankWithoutAUsableDeviceFailsCleanlyOnEveryRank) {
  const cuda::DeviceCount devices = cuda::device_count();
  NcclCommOptions options;
  options.timeout_s = 10;
  // No device here: any index fails. With devices, one past the last fails the same way.
  options.device = devices.count;
  try {
    auto comm = make_nccl_group(world_ranks(), options);
    ADD_FAILURE() << "NCCL set-up succeeded on device " << options.device;
  } catch (const ResourceError& e) {
    const std::string message = e.what();
    if (!cuda::built_with_cuda()) {
      EXPECT_NE(message.find("built without CUDA"), std::string::npos) << message;
    } else if (devices.count == 0) {
      EXPECT_NE(message.find("NCCL set-up: no usable CUDA device"), std::string::npos) << message;
    } else {
      EXPECT_NE(message.find("NCCL set-up: CUDA device"), std::string::npos) << message;
      EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank got here: nobody was left waiting in set-up
}

class NcclCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceCount devices = cuda::device_count();
    if (devices.count == 0) GTEST_SKIP() << "no CUDA device: " << devices.reason;
    // NCCL refuses two ranks of one communicator on the same GPU; this test runs all ranks on one node.
    if (devices.count < world_size()) {
      GTEST_SKIP() << "needs one GPU per rank: " << world_size() << " ranks, " << devices.count << " GPU(s)";
    }
    options_.device = cuda::device_for_local_rank(world_rank(), devices.count);
    options_.timeout_s = 30;
    cuda::select_device(options_.device);
  }

  std::vector<float> download(const cuda::DeviceBuffer& buffer, std::size_t n) {
    std::vector<float> host(n);
    cuda::copy_to_host(host.data(), buffer.data(), n * sizeof(float));
    return host;
  }
  cuda::DeviceBuffer upload(const std::vector<float>& host) {
    cuda::DeviceBuffer buffer(host.size() * sizeof(float));
    cuda::copy_to_device(buffer.data(), host.data(), host.size() * sizeof(float));
    return buffer;
  }

  NcclCommOptions options_;
};

TEST_F(NcclCollectives, EveryOperationOnDeviceBuffers) {
  const int rank = world_rank();
  const int size = world_size();
  auto comm = make_nccl_group(world_ranks(), options_);
  ASSERT_EQ(comm->rank(), rank);
  ASSERT_EQ(comm->size(), size);
  ASSERT_NE(comm->stream(), nullptr);

  // All-reduce: small integers, so the float sums are exact whatever NCCL's order.
  const std::size_t count = (1u << 20) + 3;
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((rank + 1) * (i % 7));
  auto data = upload(mine);
  comm->all_reduce_sum(data.as<float>(), count);
  const auto summed = download(data, count);
  const float ranks_sum = static_cast<float>(size * (size + 1) / 2);
  for (std::size_t i = 0; i < count; i += 4099) ASSERT_EQ(summed[i], ranks_sum * (i % 7)) << i;

  // All-gather-v with uneven counts (the vocab slices of the logits).
  std::vector<int> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = 1000 + 17 * r;
  const int total = std::accumulate(counts.begin(), counts.end(), 0);
  auto send = upload(std::vector<float>(counts[rank], static_cast<float>(rank)));
  cuda::DeviceBuffer gathered(total * sizeof(float));
  comm->all_gather_v(send.as<float>(), gathered.as<float>(), counts);
  const auto all = download(gathered, total);
  int offset = 0;
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < counts[r]; ++i) ASSERT_EQ(all[offset + i], static_cast<float>(r)) << r << " " << i;
    offset += counts[r];
  }

  // Broadcast from the last rank.
  auto word = upload({static_cast<float>(rank * 10)});
  comm->broadcast(word.data(), sizeof(float), size - 1);
  EXPECT_EQ(download(word, 1)[0], static_cast<float>((size - 1) * 10));

  comm->barrier();
  if (size == 1) return;  // the ring below needs a peer (a one-rank job checks set-up and collectives)

  // A ring of isend + recv, both directions in flight at once (the pipeline's pattern).
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  auto outgoing = upload(std::vector<float>(4096, static_cast<float>(rank)));
  cuda::DeviceBuffer incoming(4096 * sizeof(float));
  auto pending = comm->isend(outgoing.data(), 4096 * sizeof(float), next, 0);
  comm->recv(incoming.data(), 4096 * sizeof(float), prev, 0);
  pending->wait();
  EXPECT_EQ(download(incoming, 4096)[4095], static_cast<float>(prev));

  comm->barrier();
}

TEST_F(NcclCollectives, APeerThatNeverJoinsTimesOutAndAborts) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks: one stays silent";
  options_.timeout_s = 3;
  auto comm = make_nccl_group(world_ranks(), options_);
  auto data = upload(std::vector<float>(1024, 1.0f));
  if (world_rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->all_reduce_sum(data.as<float>(), 1024);
      ADD_FAILURE() << "all-reduce completed without its peers";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
    }
    const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(waited_s, 20.0);
    EXPECT_THROW(comm->barrier(), CommError);  // aborted for good
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the silent rank was never stuck either
}

// x = Σ_ranks (x + 1) + 1 for every element, as the replayed graph below computes it: exact in floats.
float after_step(float x, int size) { return static_cast<float>(size) * (x + 1.0f) + 1.0f; }

TEST_F(NcclCollectives, StreamOrderedAllReducesOverlapComputeAndReplayFromAGraph) {
  const int rank = world_rank();
  const int size = world_size();
  cuda::Stream compute;
  options_.compute_stream = compute.ref().raw;
  auto comm = make_nccl_group(world_ranks(), options_);
  const auto s = compute.ref();
  const std::size_t count = 1 << 16;
  // Uploaded on the compute stream, so the kernels below are ordered after the copies.
  auto on_stream = [&](const std::vector<float>& host) {
    cuda::DeviceBuffer buffer(host.size() * sizeof(float));
    cuda::copy_to_device_async(buffer.data(), host.data(), host.size() * sizeof(float), s);
    compute.synchronize();
    return buffer;
  };
  auto ones = on_stream(std::vector<float>(count, 1.0f));
  auto a = on_stream(std::vector<float>(count, static_cast<float>(rank)));
  auto b = on_stream(std::vector<float>(count, static_cast<float>(10 * rank)));

  // Two halves in flight at once, compute queued between start and join (the stage's row-half pipeline).
  cuda::add_inplace(a.as<float>(), ones.as<float>(), count, s);
  const int ticket_a = comm->all_reduce_sum_start(a.as<float>(), count, s.raw);
  cuda::add_inplace(b.as<float>(), ones.as<float>(), count, s);  // runs while a's all-reduce is in flight
  const int ticket_b = comm->all_reduce_sum_start(b.as<float>(), count, s.raw);
  EXPECT_NE(ticket_a, ticket_b);
  comm->all_reduce_join(ticket_a, s.raw);
  cuda::add_inplace(a.as<float>(), ones.as<float>(), count, s);  // after a's sum, whatever b is doing
  comm->all_reduce_join(ticket_b, s.raw);
  comm->synchronize(s.raw, "test step");
  float want_a = 0.0f, want_b = 0.0f;
  for (int r = 0; r < size; ++r) {
    want_a += static_cast<float>(r) + 1.0f;
    want_b += static_cast<float>(10 * r) + 1.0f;
  }
  want_a += 1.0f;
  EXPECT_EQ(download(a, count)[count - 1], want_a);
  EXPECT_EQ(download(b, count)[0], want_b);

  // The same pattern captured once, replayed three times (NCCL >= 2.9 captures collectives).
  const cuda::Graph graph = cuda::Graph::capture(compute, [&] {
    cuda::add_inplace(a.as<float>(), ones.as<float>(), count, s);
    comm->all_reduce_join(comm->all_reduce_sum_start(a.as<float>(), count, s.raw), s.raw);
    cuda::add_inplace(a.as<float>(), ones.as<float>(), count, s);
  });
  comm->synchronize(s.raw, "capture");
  EXPECT_EQ(download(a, count)[7], want_a) << "capture must not run the work";
  float want = want_a;
  for (int replay = 0; replay < 3; ++replay) {
    graph.launch(s);
    comm->synchronize(s.raw, "graph replay");
    want = after_step(want, size);
    const auto got = download(a, count);
    ASSERT_EQ(got[0], want) << "replay " << replay;
    ASSERT_EQ(got[count - 1], want) << "replay " << replay;
  }
  comm->barrier();
}

TEST_F(NcclCollectives, StreamOrderedAllReduceWithASilentPeerTimesOutAtSynchronize) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks: one stays silent";
  cuda::Stream compute;
  options_.compute_stream = compute.ref().raw;
  options_.timeout_s = 3;
  auto comm = make_nccl_group(world_ranks(), options_);
  auto data = upload(std::vector<float>(1024, 1.0f));
  if (world_rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    comm->all_reduce_join(comm->all_reduce_sum_start(data.as<float>(), 1024, compute.ref().raw), compute.ref().raw);
    try {
      comm->synchronize(compute.ref().raw, "forward");
      ADD_FAILURE() << "all-reduce completed without its peers";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("NCCL forward"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    }
    const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(waited_s, 20.0);
    EXPECT_THROW(comm->all_reduce_sum_start(data.as<float>(), 1024, compute.ref().raw), CommError);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace shardline::comm
