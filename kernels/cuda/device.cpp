// Devices, streams and memory over the CUDA runtime (the CUDA build's half of device.h).
#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "kernels/cuda/cuda_check.h"

namespace shardline::kernels::cuda {

bool built_with_cuda() { return true; }

DeviceCount device_count() noexcept {
  try {
    int count = 0;
    const cudaError_t code = cudaGetDeviceCount(&count);
    // A failed query leaves CUDA's last-error state set; clear it so it is not blamed on a later call.
    cudaGetLastError();
    if (code == cudaErrorInsufficientDriver) {
      // Also what a machine without any NVIDIA driver gets: said plainly, not as a driver version problem.
      return {0, "no NVIDIA driver, or one older than this build's CUDA runtime: cudaErrorInsufficientDriver"};
    }
    if (code == cudaErrorNoDevice) {
      return {0, fmt::format("no CUDA device visible to this process (check CUDA_VISIBLE_DEVICES; {})",
                             cuda_error_text(code))};
    }
    if (code != cudaSuccess) return {0, fmt::format("CUDA device query failed: {}", cuda_error_text(code))};
    if (count == 0) return {0, "no CUDA device visible to this process"};
    return {count, {}};
  } catch (...) {
    return {0, "CUDA device query failed with an unexpected error"};
  }
}

int device_for_local_rank(int local_rank, int n_devices) {
  SL_CHECK_MSG(n_devices > 0 && local_rank >= 0, "local rank {} over {} devices", local_rank, n_devices);
  return local_rank % n_devices;
}

DeviceProperties device_properties(int device) {
  const DeviceCount devices = device_count();
  if (devices.count == 0) throw ResourceError(fmt::format("no CUDA device: {}", devices.reason));
  if (device < 0 || device >= devices.count) {
    throw ResourceError(fmt::format("CUDA device {} does not exist (this process sees {})", device, devices.count));
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), fmt::format("cudaGetDeviceProperties({})", device));
  DeviceProperties out;
  out.index = device;
  out.name = prop.name;
  out.sm_major = prop.major;
  out.sm_minor = prop.minor;
  out.memory_bytes = prop.totalGlobalMem;
  out.multiprocessors = prop.multiProcessorCount;
  char bus_id[32] = {};
  check_cuda(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device), "cudaDeviceGetPCIBusId");
  out.pci_bus_id = bus_id;
  int numa = -1;
  // Older drivers do not know the attribute; the NUMA node is then left to hwloc.
  if (cudaDeviceGetAttribute(&numa, cudaDevAttrHostNumaId, device) == cudaSuccess) out.host_numa_node = numa;
  cudaGetLastError();
  return out;
}

void select_device(int device) {
  const DeviceCount devices = device_count();
  if (devices.count == 0) throw ResourceError(fmt::format("no CUDA device: {}", devices.reason));
  if (device < 0 || device >= devices.count) {
    throw ResourceError(fmt::format("CUDA device {} does not exist (this process sees {})", device, devices.count));
  }
  check_cuda(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
}

Stream::Stream(StreamPriority priority) {
  int least = 0;
  int greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  cudaStream_t stream = nullptr;
  // Non-blocking: no implicit synchronisation with the legacy default stream, which would serialise
  // communication behind unrelated work.
  check_cuda(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                          priority == StreamPriority::kHigh ? greatest : least),
             "cudaStreamCreateWithPriority");
  raw_ = stream;
}
Stream::~Stream() {
  if (raw_) cudaStreamDestroy(static_cast<cudaStream_t>(raw_));
}

void Stream::synchronize() const {
  // Launch errors (bad configuration) are reported only by cudaGetLastError; faults during execution by
  // the synchronisation. Check both, so a broken kernel is never silent.
  check_cuda(cudaGetLastError(), "kernel launch");
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(raw_)), "stream execution");
}

CudaAllocation::CudaAllocation(std::size_t bytes, Kind kind) : bytes_(bytes), kind_(kind) {
  if (bytes == 0) return;
  if (kind == Kind::kDevice) {
    check_cuda(cudaMalloc(&data_, bytes), fmt::format("cudaMalloc of {}", format_bytes(bytes)));
  } else {
    check_cuda(cudaMallocHost(&data_, bytes), fmt::format("cudaMallocHost of {}", format_bytes(bytes)));
  }
}
CudaAllocation::~CudaAllocation() {
  if (!data_) return;
  if (kind_ == Kind::kDevice) {
    cudaFree(data_);
  } else {
    cudaFreeHost(data_);
  }
}

void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  check_cuda(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice), "copy to device");
}
void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  check_cuda(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}
void copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, StreamRef stream) {
  check_cuda(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, native(stream)), "copy to device");
}
void copy_to_host_async(void* host_dst, const void* device_src, std::size_t bytes, StreamRef stream) {
  check_cuda(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, native(stream)), "copy to host");
}
void copy_device_to_device_async(void* dst, const void* src, std::size_t bytes, StreamRef stream) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, native(stream)), "device copy");
}
void fill_zero_async(void* device_dst, std::size_t bytes, StreamRef stream) {
  check_cuda(cudaMemsetAsync(device_dst, 0, bytes, native(stream)), "memset");
}

}  // namespace shardline::kernels::cuda
