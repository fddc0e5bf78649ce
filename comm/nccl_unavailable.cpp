// The CPU-only build's make_nccl_group: the symbol exists so runtime/ links in every build.
#include "comm/nccl_communicator.h"

#include "common/error.h"

namespace shardline::comm {

std::unique_ptr<NcclCommunicator> make_nccl_group(const std::vector<int>&, const NcclCommOptions&) {
  throw ResourceError(
      "NCCL communicator: built without CUDA (nvcc or NCCL was not found at configure time, or "
      "-DSHARDLINE_WITH_CUDA=OFF); rebuild on a machine with the CUDA toolkit and NCCL to use --device cuda");
}

}  // namespace shardline::comm
