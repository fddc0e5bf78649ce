// Private to kernels/cuda and comm/: the one wrapper every CUDA return code goes through. It turns a failure
// into ResourceError carrying CUDA's own error name and message, and the operation that failed.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/cuda/device.h"

namespace shardline::kernels::cuda {

inline std::string cuda_error_text(cudaError_t code) {
  return fmt::format("{}: {}", cudaGetErrorName(code), cudaGetErrorString(code));
}

inline void check_cuda(cudaError_t code, const std::string& what) {
  if (code == cudaSuccess) return;
  throw ResourceError(fmt::format("CUDA {} failed: {}", what, cuda_error_text(code)));
}

inline cudaStream_t native(StreamRef stream) { return static_cast<cudaStream_t>(stream.raw); }

}  // namespace shardline::kernels::cuda
