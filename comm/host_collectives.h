// All-reduce, all-gather and ordered sums (tensor parallelism's) through one shared-memory segment, for a
// communicator whose ranks all run on one host (internal to comm/: MpiCommunicator uses it for the groups
// that ask for it, the runtime's world and TP groups).
//
// Why: a decode step all-reduces its activations twice per layer, a few KiB to a few hundred KiB each
// time. Open MPI's non-blocking collectives (what MpiCommunicator polls against its timeout) took 29 us for
// 48 KiB between two ranks of this machine, its blocking ones 20 us; a copy into shared memory, a flag and
// a sum take a few. On tp=2 of the 110M shape a batch-16 int8 step spent 1.0-1.1 ms of about 7 in its 24
// all-reduces and 0.44 ms gathering the logits (BENCHMARKS.md, issue #7).
//
// How: rank 0 creates a POSIX shared-memory segment, the others open it by the name it broadcasts, each
// allocates its own region (on its NUMA node), and it is unlinked once all have mapped it (nothing is left
// in /dev/shm, also when a rank fails to map it; teardown is a local munmap: it cannot wait on a dead
// peer). Setting up is a few blocking MPI collectives, like creating the group itself; the operations
// after it are bounded by the timeout. Every rank owns a flag (its own page) and two slots of kSlotBytes.
// Call number s writes the rank's data into slot s % 2, publishes s in its flag (release), waits until
// every flag reached s (acquire), and reads all slots. Two slots suffice: a rank publishes s + 1 only after
// it finished reading call s, so once a rank has seen every flag at s + 1 and writes slot s % 2 again for
// call s + 2, nobody reads call s's slots any more. Data larger than a slot goes in rounds.
//
// Results: sums are added in rank order (slot 0 + slot 1 + ...), the same order on every rank, so every
// rank gets the same bits. Waits back off as every wait in comm/ does (poller.h), keep MPI's progress
// engine going once past spinning (a pipeline send may be in flight), and end in a CommError naming the
// rank that did not arrive once the --comm-timeout passes.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shardline::comm {

class Poller;  // comm/poller.h

class HostCollectives {
 public:
  static constexpr std::size_t kSlotBytes = std::size_t{256} << 10;

  // Collective over comm. Null when comm's ranks are not all on this host (MPI_COMM_TYPE_SHARED) or some
  // rank could not create or map the segment (no /dev/shm, too small): the caller keeps MPI's collectives.
  static std::unique_ptr<HostCollectives> create(MPI_Comm comm, double timeout_s);
  ~HostCollectives();
  HostCollectives(const HostCollectives&) = delete;
  HostCollectives& operator=(const HostCollectives&) = delete;

  void all_reduce_sum(float* data, std::size_t count);
  // counts[r] floats from every rank r into recv, in rank order; send holds counts[rank] floats.
  void all_gather_v(const float* send, float* recv, const std::vector<int>& counts);
  // bytes_each bytes from every rank into recv (size * bytes_each), in rank order (Communicator's; the TP
  // ranks' greedy picks, where MPI's nonblocking all-gather allocated on every call).
  void all_gather_bytes(const void* send, std::size_t bytes_each, void* recv);
  // Communicator::ordered_sum: each rank waits for the one before to publish its sum, adds its own values,
  // publishes the result; every rank then reads the last one's. A rank publishes call s after reading the
  // slot before it and reads the last slot after; it writes its slot again at s + 2 only once the chain of
  // call s + 1 has passed every rank, so no slot is overwritten before it is read.
  void ordered_sum(float* data, std::size_t count, Communicator::AddOwn add_own);

 private:
  HostCollectives(MPI_Comm comm, void* segment, std::size_t bytes, double timeout_s);
  float* slot(int rank, std::uint64_t call) const;
  // Publishes call number `call` (this rank's slot for it is written) and waits for every rank's.
  void publish_and_wait(std::uint64_t call, const char* what);
  void publish(std::uint64_t call);
  // Waits until rank r has published call number `call`.
  void wait_for(int r, std::uint64_t call, Poller& poller, const char* what);

  MPI_Comm comm_;  // the caller's, to keep MPI progressing while waiting
  void* segment_;
  std::size_t bytes_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t calls_ = 0;  // calls this rank has completed
};

}  // namespace shardline::comm
