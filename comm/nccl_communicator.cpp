#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "comm/mpi_communicator.h"
#include "comm/liveness.h"
#include "comm/peer_name.h"
#include "comm/poller.h"
#include "common/error.h"
#include "kernels/cuda/cuda_check.h"

namespace shardline::comm {

namespace {

using kernels::cuda::check_cuda;

std::string nccl_text(ncclResult_t code, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("{}{}{}", ncclGetErrorString(code), last && *last ? ": " : "", last ? last : "");
}

struct NcclPendingSend;

class NcclComm final : public NcclCommunicator {
 public:
  // world_ranks: the group's members by their world rank, for error messages.
  NcclComm(ncclComm_t comm, int rank, int size, std::vector<int> world_ranks, const NcclCommOptions& options)
      : comm_(comm), rank_(rank), size_(size), world_ranks_(std::move(world_ranks)), options_(options) {
    int least = 0;
    int greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    // Sends get a stream of their own: an isend queued on the receive stream could wait behind a recv whose
    // sender waits for this send (A: send then recv, B: send then recv).
    check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "communication stream");
    check_cuda(cudaStreamCreateWithPriority(&send_stream_, cudaStreamNonBlocking, greatest), "send stream");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "event");
    for (cudaEvent_t& join : joins_) check_cuda(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "event");
    check_cuda(cudaMalloc(&barrier_word_, sizeof(float)), "cudaMalloc of the barrier word");
  }

  ~NcclComm() override {
    if (!aborted_) {
      // Finalize flushes outstanding work, bounded like everything else; anything but a clean finish aborts.
      ncclResult_t state = ncclCommFinalize(comm_);
      if (state == ncclSuccess || state == ncclInProgress) {
        Poller poller(options_.timeout_s);
        while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress && poller.pause()) {
        }
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    cudaFree(barrier_word_);
    for (cudaEvent_t join : joins_) cudaEventDestroy(join);
    cudaEventDestroy(fork_);
    cudaEventDestroy(done_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(send_stream_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* stream() const override { return stream_; }

  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  void all_reduce_sum(float* data, std::size_t count) override {
    run("all-reduce", -1, stream_,
        [&] { return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_); });
  }

  int all_reduce_sum_start(float* data, std::size_t count, void* stream) override {
    if (aborted_) throw CommError("NCCL all-reduce on a communicator aborted earlier");
    // cudaSetDevice only when needed: inside a graph capture the fewer runtime calls the better.
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != options_.device) use_device();
    const auto compute = static_cast<cudaStream_t>(stream);
    // Fork: the communication stream waits for the producer of `data`.
    check_cuda(cudaEventRecord(fork_, compute), "event record");
    check_cuda(cudaStreamWaitEvent(stream_, fork_, 0), "stream wait");
    const ncclResult_t queued = ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_);
    if (queued != ncclSuccess && queued != ncclInProgress) fail("all-reduce", -1, nccl_text(queued, comm_));
    Poller poller(options_.timeout_s);
    wait_enqueued("all-reduce", -1, poller);
    // The join event is recorded now, right behind this all-reduce, so a later join waits for it and not
    // for all-reduces started after it.
    const int ticket = next_ticket_;
    next_ticket_ = (next_ticket_ + 1) % kMaxAllReducesInFlight;
    check_cuda(cudaEventRecord(joins_[ticket], stream_), "event record");
    return ticket;
  }

  void all_reduce_join(int ticket, void* stream) override {
    SL_CHECK(ticket >= 0 && ticket < kMaxAllReducesInFlight);
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), joins_[ticket], 0), "stream wait");
  }

  void synchronize(void* stream, const char* what) override {
    if (aborted_) throw CommError(fmt::format("NCCL {} on a communicator aborted earlier", what));
    Poller poller(options_.timeout_s);
    check_cuda(cudaEventRecord(done_, static_cast<cudaStream_t>(stream)), "event record");
    wait_event(done_, what, -1, poller);
    check_cuda(cudaGetLastError(), "kernel launch");
  }

  void all_gather_v(const float* send, float* recv, const std::vector<int>& counts) override {
    SL_CHECK(static_cast<int>(counts.size()) == size_);
    // NCCL has no all-gather-v: one broadcast per member, fused into one group (one launch).
    run("all-gather", -1, stream_, [&] {
      std::size_t offset = 0;
      ncclResult_t result = ncclGroupStart();
      for (int r = 0; r < size_ && result == ncclSuccess; ++r) {
        if (counts[r] > 0) {
          result = ncclBroadcast(r == rank_ ? send : recv + offset, recv + offset, counts[r], ncclFloat32, r, comm_,
                                 stream_);
        }
        offset += counts[r];
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    });
  }

  void all_gather_bytes(const void* send, std::size_t bytes_each, void* recv) override {
    run("all-gather", -1, stream_,
        [&] { return ncclAllGather(send, recv, bytes_each, ncclUint8, comm_, stream_); });
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    run("broadcast", root, stream_,
        [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }

  void send(const void* data, std::size_t bytes, int dst, int tag) override {
    run("send", dst, send_stream_, [&] { return ncclSend(data, bytes, ncclUint8, dst, comm_, send_stream_); });
  }

  void recv(void* data, std::size_t bytes, int src, int tag) override {
    run("recv", src, stream_, [&] { return ncclRecv(data, bytes, ncclUint8, src, comm_, stream_); });
  }

  std::unique_ptr<PendingSend> isend(const void* data, std::size_t bytes, int dst, int tag) override;

  void barrier() override {
    run("barrier", -1, stream_,
        [&] { return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }

 private:
  friend struct NcclPendingSend;

  void use_device() const { check_cuda(cudaSetDevice(options_.device), "cudaSetDevice"); }

  [[noreturn]] void fail(const std::string& what, int peer, const std::string& why) {
    abort();
    // The peer by its world rank, as MPI's errors (peer_name.h) and the log tags name it.
    throw CommError(fmt::format("NCCL {} {}failed: {}; communicator aborted", what,
                                peer >= 0 ? fmt::format("with {} ", peer_name(world_ranks_[peer], peer)) : std::string(),
                                why));
  }
  [[noreturn]] void time_out(const std::string& what, int peer) {
    const std::string cause = timeout_cause_note();  // before the abort: the others may be asking this rank
    fail(what, peer, fmt::format("timed out after {:g} s (--comm-timeout){}", options_.timeout_s, cause));
  }

  // Queues one operation on `stream` after the compute stream's queued work, then waits for it to finish.
  template <typename Enqueue>
  void run(const char* what, int peer, cudaStream_t stream, Enqueue enqueue) {
    if (aborted_) throw CommError(fmt::format("NCCL {} on a communicator aborted earlier", what));
    use_device();
    Poller poller(options_.timeout_s);
    check_cuda(cudaEventRecord(ready_, static_cast<cudaStream_t>(options_.compute_stream)), "event record");
    check_cuda(cudaStreamWaitEvent(stream, ready_, 0), "stream wait");
    const ncclResult_t queued = enqueue();
    if (queued != ncclSuccess && queued != ncclInProgress) fail(what, peer, nccl_text(queued, comm_));
    wait_enqueued(what, peer, poller);
    check_cuda(cudaEventRecord(done_, stream), "event record");
    wait_event(done_, what, peer, poller);
  }

  // A non-blocking communicator may still be enqueueing when the call returns (ncclInProgress).
  void wait_enqueued(const char* what, int peer, Poller& poller) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
      if (queried != ncclSuccess) fail(what, peer, nccl_text(queried, comm_));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, peer, nccl_text(state, comm_));
      if (poller.spun_out()) answer_pings();
      if (!poller.pause()) time_out(what, peer);
    }
  }

  // Waits for an event on the device, watching NCCL's asynchronous errors (a peer's network failure) too.
  void wait_event(cudaEvent_t event, const char* what, int peer, Poller& poller) {
    for (;;) {
      const cudaError_t done = cudaEventQuery(event);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) fail(what, peer, kernels::cuda::cuda_error_text(done));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) fail(what, peer, nccl_text(state, comm_));
      if (poller.spun_out()) answer_pings();
      if (!poller.pause()) time_out(what, peer);
    }
  }

  ncclComm_t comm_;
  int rank_;
  int size_;
  std::vector<int> world_ranks_;  // the group's rank r is world rank world_ranks_[r]
  NcclCommOptions options_;
  cudaStream_t stream_ = nullptr;       // collectives and receives
  cudaStream_t send_stream_ = nullptr;  // sends
  cudaEvent_t ready_ = nullptr;         // the compute stream's work before an operation
  cudaEvent_t done_ = nullptr;          // an operation's completion
  cudaEvent_t fork_ = nullptr;          // all_reduce_sum_start: the compute stream's work before it
  cudaEvent_t joins_[kMaxAllReducesInFlight] = {};  // all_reduce_sum_start: each one's result, by ticket
  int next_ticket_ = 0;
  float* barrier_word_ = nullptr;       // (1) the barrier's all-reduce operand
  bool aborted_ = false;
};

struct NcclPendingSend final : PendingSend {
  NcclPendingSend(NcclComm* comm, int dst) : comm(comm), dst(dst) {
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event");
  }
  ~NcclPendingSend() override { cudaEventDestroy(event); }  // released by CUDA once the send completes
  void wait() override {
    if (waited) return;
    waited = true;
    Poller poller(comm->options_.timeout_s);
    comm->wait_event(event, "send", dst, poller);
  }
  NcclComm* comm;
  int dst;
  cudaEvent_t event = nullptr;
  bool waited = false;
};

std::unique_ptr<PendingSend> NcclComm::isend(const void* data, std::size_t bytes, int dst, int tag) {
  if (aborted_) throw CommError("NCCL send on a communicator aborted earlier");
  use_device();
  auto pending = std::make_unique<NcclPendingSend>(this, dst);
  Poller poller(options_.timeout_s);
  check_cuda(cudaEventRecord(ready_, static_cast<cudaStream_t>(options_.compute_stream)), "event record");
  check_cuda(cudaStreamWaitEvent(send_stream_, ready_, 0), "stream wait");
  const ncclResult_t queued = ncclSend(data, bytes, ncclUint8, dst, comm_, send_stream_);
  if (queued != ncclSuccess && queued != ncclInProgress) fail("send", dst, nccl_text(queued, comm_));
  wait_enqueued("send", dst, poller);
  check_cuda(cudaEventRecord(pending->event, send_stream_), "event record");
  return pending;
}

// What rank 0 of the group broadcasts: whether it could create the id, and the id.
struct Bootstrap {
  int ok = 0;
  ncclUniqueId id{};
};

// This rank's device, made current; an empty string when usable, else why not.
std::string prepare_device(int device) {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (code != cudaSuccess) return fmt::format("no usable CUDA device ({})", kernels::cuda::cuda_error_text(code));
  if (device < 0 || device >= count) return fmt::format("CUDA device {} does not exist ({} visible)", device, count);
  const cudaError_t set = cudaSetDevice(device);
  if (set != cudaSuccess) return fmt::format("cudaSetDevice({}) failed: {}", device, kernels::cuda::cuda_error_text(set));
  return {};
}

}  // namespace

std::unique_ptr<NcclCommunicator> make_nccl_group(const std::vector<int>& ranks, const NcclCommOptions& options) {
  // The group's MPI communicator carries the bootstrap, bounded by the same timeout.
  const std::unique_ptr<Communicator> host = make_mpi_group(ranks, MpiCommOptions{options.timeout_s});
  const int rank = host->rank();
  const int size = host->size();

  // Every member learns whether every other has a usable device, so a rank without one fails alone with
  // its reason and the others fail with a pointer to it, instead of waiting in ncclCommInitRank.
  const std::string problem = prepare_device(options.device);
  std::vector<char> usable(size);
  const char mine = problem.empty() ? 1 : 0;
  host->all_gather_bytes(&mine, 1, usable.data());
  if (!problem.empty()) throw ResourceError(fmt::format("NCCL set-up: {}", problem));
  for (int r = 0; r < size; ++r) {
    if (!usable[r]) {
      throw ResourceError(fmt::format("NCCL set-up: {} has no usable GPU", peer_name(ranks[r], r)));
    }
  }

  Bootstrap bootstrap;
  std::string id_error;
  if (rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&bootstrap.id);
    bootstrap.ok = made == ncclSuccess ? 1 : 0;
    if (made != ncclSuccess) id_error = nccl_text(made, nullptr);
  }
  host->broadcast(&bootstrap, sizeof(bootstrap), 0);
  if (!bootstrap.ok) {
    throw CommError(fmt::format("NCCL set-up: ncclGetUniqueId failed on the group's rank 0{}{}",
                                id_error.empty() ? "" : ": ", id_error));
  }

  // Non-blocking: ncclCommInitRankConfig returns at once and the state is polled, so a member that never
  // arrives ends in a timeout and an abort instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, size, bootstrap.id, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    throw CommError(fmt::format("NCCL set-up: ncclCommInitRank failed: {}", nccl_text(started, comm)));
  }
  Poller poller(options.timeout_s);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress || !poller.pause()) {
      const std::string why = state != ncclInProgress
                                  ? nccl_text(state, comm)
                                  : fmt::format("timed out after {:g} s (--comm-timeout): a peer did not join",
                                                options.timeout_s);
      ncclCommAbort(comm);
      throw CommError(fmt::format("NCCL set-up: ncclCommInitRank failed: {}; communicator aborted", why));
    }
  }
  try {
    return std::make_unique<NcclComm>(comm, rank, size, ranks, options);
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
}

}  // namespace shardline::comm
