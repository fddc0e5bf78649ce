// The CPU-only build's half of device.h and ops.h: the same symbols, so runtime/ links and chooses its
// backend at run time. device_count() says why there is no GPU; everything else throws ResourceError.
// (Kernels never throw elsewhere; here they cannot be reached, since no device buffer can exist.)
#include <string>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/ops.h"

namespace shardline::kernels::cuda {

namespace {

constexpr const char* kReason =
    "built without CUDA (nvcc was not found at configure time, or -DSHARDLINE_WITH_CUDA=OFF); rebuild on a "
    "machine with the CUDA toolkit and NCCL to use --device cuda";

[[noreturn]] void unavailable(const char* what) {
  throw ResourceError(fmt::format("{}: {}", what, kReason));
}

}  // namespace

bool built_with_cuda() { return false; }

DeviceCount device_count() noexcept { return {0, kReason}; }

int device_for_local_rank(int local_rank, int n_devices) {
  SL_CHECK_MSG(n_devices > 0 && local_rank >= 0, "local rank {} over {} devices", local_rank, n_devices);
  return local_rank % n_devices;
}

DeviceProperties device_properties(int) { unavailable("CUDA device query"); }
void select_device(int) { unavailable("CUDA device selection"); }

Stream::Stream(StreamPriority) { unavailable("CUDA stream"); }
Stream::~Stream() = default;
void Stream::synchronize() const { unavailable("CUDA stream"); }

CudaAllocation::CudaAllocation(std::size_t, Kind kind) {
  unavailable(kind == Kind::kDevice ? "CUDA device memory" : "CUDA pinned memory");
}
CudaAllocation::~CudaAllocation() = default;

void copy_to_device(void*, const void*, std::size_t) { unavailable("CUDA copy"); }
void copy_to_host(void*, const void*, std::size_t) { unavailable("CUDA copy"); }
void copy_to_device_async(void*, const void*, std::size_t, StreamRef) { unavailable("CUDA copy"); }
void copy_to_host_async(void*, const void*, std::size_t, StreamRef) { unavailable("CUDA copy"); }
void copy_device_to_device_async(void*, const void*, std::size_t, StreamRef) { unavailable("CUDA copy"); }
void fill_zero_async(void*, std::size_t, StreamRef) { unavailable("CUDA memset"); }

void rmsnorm(float*, const float*, const float*, int, int, float, StreamRef) { unavailable("CUDA rmsnorm"); }
void rope(float*, const int*, int, int, int, float, const float*, StreamRef) { unavailable("CUDA rope"); }
void swiglu(float*, const float*, std::size_t, StreamRef) { unavailable("CUDA swiglu"); }
void add_inplace(float*, const float*, std::size_t, StreamRef) { unavailable("CUDA add"); }
void kv_write_paged(const PagedKvWrite&, StreamRef) { unavailable("CUDA KV write"); }
void embedding(float*, const float*, const int*, int, int, StreamRef) { unavailable("CUDA embedding"); }
void convert_to_bf16(std::uint16_t*, const float*, std::size_t, StreamRef) { unavailable("CUDA bf16 conversion"); }
void attention_paged(const PagedAttention&, StreamRef) { unavailable("CUDA attention"); }
void argmax(int*, const float*, int, int, StreamRef) { unavailable("CUDA argmax"); }

DeviceMatrix DeviceMatrix::upload(const float*, std::size_t, int, int, DeviceDtype) {
  unavailable("CUDA weight upload");
}

struct Blas::Impl {};
Blas::Blas(const BlasOptions&) { unavailable("cuBLAS"); }
Blas::Blas(Blas&&) noexcept = default;
Blas& Blas::operator=(Blas&&) noexcept = default;
Blas::~Blas() = default;
void Blas::matmul(float*, const float*, const DeviceMatrixView&, int, StreamRef) { unavailable("cuBLAS"); }

struct TokenSampler::Impl {};
TokenSampler::TokenSampler(const TokenSamplerOptions&) { unavailable("CUDA sampler"); }
TokenSampler::TokenSampler(TokenSampler&&) noexcept = default;
TokenSampler& TokenSampler::operator=(TokenSampler&&) noexcept = default;
TokenSampler::~TokenSampler() = default;
void TokenSampler::sample(int*, float*, const float*, int, float, float, StreamRef) { unavailable("CUDA sampler"); }

Graph Graph::capture(const Stream&, const std::function<void()>&) { unavailable("CUDA graph"); }
Graph::~Graph() = default;
void Graph::launch(StreamRef) const { unavailable("CUDA graph"); }

}  // namespace shardline::kernels::cuda
