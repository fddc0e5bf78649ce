#include "comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "comm/host_collectives.h"
#include "comm/liveness.h"
#include "comm/mpi_check.h"
#include "comm/peer_name.h"
#include "comm/poller.h"
#include "common/error.h"

namespace shardline::comm {

namespace {

class MpiCommunicator;

struct MpiPendingSend final : PendingSend {
  MpiPendingSend(MpiCommunicator* comm, int dst) : comm(comm), dst(dst) {}
  ~MpiPendingSend() override;
  void wait() override;
  MpiCommunicator* comm;
  int dst;
  MPI_Request request = MPI_REQUEST_NULL;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned, const MpiCommOptions& options)
      : comm_(comm), owned_(owned), options_(options) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    if (options_.host_collectives) host_ = HostCollectives::create(comm_, options_.timeout_s);
  }
  ~MpiCommunicator() override {
    if (owned_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void ordered_sum(float* data, std::size_t count, AddOwn add_own) override {
    if (host_) return host_->ordered_sum(data, count, add_own);
    Communicator::ordered_sum(data, count, add_own);
  }

  void all_reduce_sum(float* data, std::size_t count) override {
    if (size_ == 1) return;
    if (host_) return host_->all_reduce_sum(data, count);
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(count), MPI_FLOAT, MPI_SUM, comm_, &request),
              "all-reduce");
    wait(request, "all-reduce", -1);
  }

  void all_gather_v(const float* send, float* recv, const std::vector<int>& counts) override {
    SL_CHECK(static_cast<int>(counts.size()) == size_);
    if (host_) return host_->all_gather_v(send, recv, counts);
    std::vector<int> displacements(size_, 0);
    for (int r = 1; r < size_; ++r) displacements[r] = displacements[r - 1] + counts[r - 1];
    MPI_Request request;
    check_mpi(MPI_Iallgatherv(send, counts[rank_], MPI_FLOAT, recv, counts.data(), displacements.data(), MPI_FLOAT,
                              comm_, &request),
              "all-gather");
    wait(request, "all-gather", -1);
  }

  void all_gather_bytes(const void* send, std::size_t bytes_each, void* recv) override {
    if (host_) return host_->all_gather_bytes(send, bytes_each, recv);
    MPI_Request request;
    check_mpi(MPI_Iallgather(send, checked_count(bytes_each), MPI_BYTE, recv, checked_count(bytes_each), MPI_BYTE,
                             comm_, &request),
              "all-gather");
    wait(request, "all-gather", -1);
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    MPI_Request request;
    check_mpi(MPI_Ibcast(data, checked_count(bytes), MPI_BYTE, root, comm_, &request), "broadcast");
    // The root waits for the others, not for itself: "broadcast with rank 0" on rank 0 blamed the wrong rank.
    if (root == rank_) {
      wait(request, "broadcast from this rank", -1);
    } else {
      wait(request, "broadcast", root);
    }
  }

  void send(const void* data, std::size_t bytes, int dst, int tag) override {
    MPI_Request request;
    check_mpi(MPI_Isend(data, checked_count(bytes), MPI_BYTE, dst, tag, comm_, &request), "send");
    wait(request, "send", dst);
  }

  void recv(void* data, std::size_t bytes, int src, int tag) override {
    MPI_Request request;
    check_mpi(MPI_Irecv(data, checked_count(bytes), MPI_BYTE, src, tag, comm_, &request), "recv");
    MPI_Status status;
    wait(request, "recv", src, &status);
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (static_cast<std::size_t>(got) != bytes) {
      throw CommError(fmt::format("recv from rank {} got {} bytes, expected {}", src, got, bytes));
    }
  }

  std::unique_ptr<PendingSend> isend(const void* data, std::size_t bytes, int dst, int tag) override {
    auto pending = std::make_unique<MpiPendingSend>(this, dst);
    check_mpi(MPI_Isend(data, checked_count(bytes), MPI_BYTE, dst, tag, comm_, &pending->request), "send");
    return pending;
  }

  void barrier() override {
    MPI_Request request;
    check_mpi(MPI_Ibarrier(comm_, &request), "barrier");
    wait(request, "barrier", -1);
  }

  void idle_barrier() override {
    MPI_Request request;
    check_mpi(MPI_Ibarrier(comm_, &request), "barrier");
    wait(request, "barrier", -1, nullptr, kIdlePollNs);
  }

 private:
  static int checked_count(std::size_t count) {
    SL_CHECK_MSG(count <= static_cast<std::size_t>(INT32_MAX), "message of {} elements is too large for MPI", count);
    return static_cast<int>(count);
  }

  friend struct MpiPendingSend;

  static constexpr long kIdlePollNs = 5'000'000;  // idle_barrier(): 5 ms between polls

  // Polls until done, with comm/poller.h's backoff.
  void wait(MPI_Request& request, const char* what, int peer, MPI_Status* status = nullptr, long sleep_ns = 50'000) {
    Poller poller(options_.timeout_s, sleep_ns);
    for (;;) {
      int done = 0;
      check_mpi(MPI_Test(&request, &done, status ? status : MPI_STATUS_IGNORE), what);
      if (done) return;
      if (poller.spun_out()) answer_pings();
      if (!poller.pause()) {
        const std::string cause = timeout_cause_note();  // who is stuck: often not the peer waited for
        MPI_Cancel(&request);
        throw CommError(fmt::format("{} {}timed out after {:g} s (--comm-timeout){}", what,
                                    peer >= 0 ? fmt::format("with {} ", peer_name(comm_, peer)) : std::string(),
                                    options_.timeout_s, cause));
      }
    }
  }

  MPI_Comm comm_;
  bool owned_;
  MpiCommOptions options_;
  std::unique_ptr<HostCollectives> host_;  // null: MPI's collectives
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
};

void MpiPendingSend::wait() {
  if (request != MPI_REQUEST_NULL) comm->wait(request, "send", dst);
}

MpiPendingSend::~MpiPendingSend() {
  // A send still in flight at destruction is only possible while unwinding an error; do not block then.
  if (request != MPI_REQUEST_NULL) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  }
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_world(const MpiCommOptions& options) {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false, options);
}

std::unique_ptr<Communicator> make_mpi_group(const std::vector<int>& ranks, const MpiCommOptions& options) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const auto me = std::find(ranks.begin(), ranks.end(), world_rank);
  SL_CHECK_MSG(me != ranks.end(), "rank {} is not in the group it asked for", world_rank);
  // Color = the group's smallest rank identifies the group; key = position orders ranks inside it.
  const int color = *std::min_element(ranks.begin(), ranks.end());
  const int key = static_cast<int>(me - ranks.begin());
  MPI_Comm group;
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, color, key, &group), "comm split");
  int size = 0;
  MPI_Comm_size(group, &size);
  SL_CHECK_MSG(size == static_cast<int>(ranks.size()), "group of {} ranks came out with {}", ranks.size(), size);
  return std::make_unique<MpiCommunicator>(group, true, options);
}

}  // namespace shardline::comm
