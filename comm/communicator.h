// The collectives a forward pass needs, behind one interface. Algorithms (the runtime's forward pass) do
// not know which transport runs them: a single process, MPI, or NCCL.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "common/function_ref.h"

namespace shardline::comm {

// A send in flight; wait() returns once the buffer may be reused.
class PendingSend {
 public:
  virtual ~PendingSend() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank inside this communicator
  virtual int size() const = 0;

  // In-place elementwise sum over all members.
  virtual void all_reduce_sum(float* data, std::size_t count) = 0;
  // Gathers counts[r] floats from every member r into recv, in rank order (counts may differ: uneven
  // vocab slices). send holds counts[rank()] floats.
  virtual void all_gather_v(const float* send, float* recv, const std::vector<int>& counts) = 0;
  // A sum in rank order: member 0's values (data, going in) + member 1's + ..., each member adding its own
  // onto the sum of the members before it (add_own(y, offset, n): y[0, n) += its values [offset, offset + n);
  // not called on member 0), the whole sum coming out in every member's data (count floats). The same
  // floats added in the same order whatever the members, so a caller that cuts a sum into more or fewer
  // members' parts, each added in order, gets the same bits (runtime::Stage's tensor-parallel sums).
  // This default passes the sum along by send and recv and broadcasts it from the last member.
  using AddOwn = FunctionRef<void(float* y, std::size_t offset, std::size_t n)>;
  virtual void ordered_sum(float* data, std::size_t count, AddOwn add_own) {
    constexpr int kOrderedSumTag = 0x5d1;
    const int last = size() - 1;
    if (rank() > 0) {
      recv(data, count * sizeof(float), rank() - 1, kOrderedSumTag);
      add_own(data, 0, count);
    }
    if (rank() < last) send(data, count * sizeof(float), rank() + 1, kOrderedSumTag);
    if (last > 0) broadcast(data, count * sizeof(float), last);
  }
  // Gathers bytes_each bytes from every member into recv (size() * bytes_each), in rank order.
  virtual void all_gather_bytes(const void* send, std::size_t bytes_each, void* recv) = 0;
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Point-to-point by rank inside this communicator.
  virtual void send(const void* data, std::size_t bytes, int dst, int tag) = 0;
  virtual void recv(void* data, std::size_t bytes, int src, int tag) = 0;
  // Starts a send and returns at once; data must stay valid until the PendingSend's wait() returns.
  virtual std::unique_ptr<PendingSend> isend(const void* data, std::size_t bytes, int dst, int tag) = 0;
  virtual void barrier() = 0;
  // A barrier for members expected to wait long, while another works alone (`probe` measures its host on
  // rank 0): they poll every few milliseconds instead of every 50 us, so their wake-ups stay off the cores
  // the working member is measuring.
  virtual void idle_barrier() { barrier(); }
};

// A communicator of one member: collectives are copies or no-ops. Used by single-rank runs and by
// any group of size one (tp=1), so the forward pass has no special cases.
std::unique_ptr<Communicator> make_solo_communicator();

}  // namespace shardline::comm
