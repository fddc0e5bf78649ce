// Communicator over NCCL for device buffers: the TP all-reduce and the PP send/recv of the CUDA backend.
// Needs no CUDA headers, so runtime/ includes it in every build; without CUDA, make_nccl_group throws
// ResourceError "built without CUDA".
//
// Bootstrap over MPI (FasterTransformer's nccl_utils and gloo's mpi/context do the same): the group's MPI
// communicator is split from the world, its rank 0 creates the ncclUniqueId, an MPI broadcast hands it to
// the others, and every member calls ncclCommInitRank. The NCCL communicator is non-blocking
// (ncclConfig_t::blocking = 0), so no NCCL call can wait forever: set-up and every operation are polled
// against --comm-timeout, and on timeout or an asynchronous NCCL error the communicator is aborted
// (ncclCommAbort, which also stops NCCL kernels spinning on a dead peer) and CommError names the operation.
//
// Streams: operations run on the communicator's own high-priority stream, so they overtake queued compute
// kernels. Each operation first waits (on the device, through an event) for the work already queued on
// compute_stream, which produced the buffer. Every Communicator method returns once the operation has
// completed, like the MPI communicator: the pointers given to it may be reused at once by any stream or the
// host. The stream-ordered all-reduce below is the exception the decode loop uses.
// Point-to-point tags are accepted for the interface but NCCL has none: messages between two ranks arrive in
// the order they were sent, which is what the pipeline's schedule relies on anyway.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shardline::comm {

struct NcclCommOptions {
  int device = 0;                  // this rank's CUDA device (kernels::cuda::device_for_local_rank)
  double timeout_s = 120.0;        // longest wait for peers in set-up or one operation (--comm-timeout)
  void* compute_stream = nullptr;  // cudaStream_t that produces the buffers; nullptr = legacy default stream
};

class NcclCommunicator : public Communicator {
 public:
  // Stream-ordered all-reduce, the CUDA stage's TP point, in two halves so that compute can run while it
  // is in flight. start: the collective is queued on the high-priority communication stream after the work
  // `stream` (a cudaStream_t) has queued so far (an event), and a ticket is returned; join: `stream`'s later
  // work waits for that all-reduce's result (another event). Neither waits on the host, so a layer's kernels
  // and all-reduces queue back to back and the whole step can be captured in a CUDA graph on `stream` (NCCL
  // >= 2.9; the events become the graph's edges between the streams). Between start and join, `stream` may
  // run anything that does not touch `data`. At most kMaxAllReducesInFlight may be started and not joined.
  // Errors and timeouts surface at synchronize(). Every member queues the same sequence of operations.
  static constexpr int kMaxAllReducesInFlight = 4;
  virtual int all_reduce_sum_start(float* data, std::size_t count, void* stream) = 0;
  virtual void all_reduce_join(int ticket, void* stream) = 0;
  // Waits on the host for the work queued on `stream`, bounded by the timeout and watching NCCL's
  // asynchronous errors (a dead peer), so no NCCL kernel spins forever: on either, or on a failed kernel in
  // `stream` (CUDA's message), the communicator is aborted and CommError names `what`.
  virtual void synchronize(void* stream, const char* what) = 0;

  // The communication stream (cudaStream_t), created with the device's greatest priority.
  virtual void* stream() const = 0;
  // Aborts the NCCL communicator now; every later operation throws CommError. Idempotent.
  virtual void abort() = 0;
};

// An NCCL communicator of exactly `ranks` (world ranks, in the order they get ranks 0..n-1), which must
// contain this process; the same contract as make_mpi_group: collective over the MPI world, every process
// calls it once with its own group, and the groups partition the world. MPI must be initialised.
// ResourceError when there is no usable device, CommError when set-up fails or times out.
std::unique_ptr<NcclCommunicator> make_nccl_group(const std::vector<int>& ranks, const NcclCommOptions& options);

}  // namespace shardline::comm
