#include <cstring>

#include "comm/communicator.h"
#include "common/error.h"

namespace shardline::comm {

namespace {

class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, std::size_t) override {}
  void all_gather_v(const float* send, float* recv, const std::vector<int>& counts) override {
    SL_CHECK(counts.size() == 1);
    if (send != recv) std::memcpy(recv, send, sizeof(float) * static_cast<std::size_t>(counts[0]));
  }
  void all_gather_bytes(const void* send, std::size_t bytes_each, void* recv) override {
    if (send != recv) std::memcpy(recv, send, bytes_each);
  }
  void broadcast(void*, std::size_t, int root) override { SL_CHECK(root == 0); }
  void send(const void*, std::size_t, int, int) override {
    SL_CHECK_MSG(false, "send on a single-member communicator");
  }
  void recv(void*, std::size_t, int, int) override { SL_CHECK_MSG(false, "recv on a single-member communicator"); }
  std::unique_ptr<PendingSend> isend(const void*, std::size_t, int, int) override {
    SL_CHECK_MSG(false, "isend on a single-member communicator");
    return nullptr;
  }
  void barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_solo_communicator() { return std::make_unique<SoloCommunicator>(); }

}  // namespace shardline::comm
