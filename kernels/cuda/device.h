// CUDA devices, streams and device memory, behind a header that needs no CUDA headers: runtime/ includes it
// in every build. In a build without CUDA (no nvcc at configure time, or -DSHARDLINE_WITH_CUDA=OFF) the
// same functions exist: device_count() reports 0 with the reason, everything else throws ResourceError
// "built without CUDA".
//
// Errors: every CUDA return code goes through one wrapper that throws ResourceError with CUDA's own name
// and message ("CUDA cudaMalloc of 1.5 GiB failed: cudaErrorMemoryAllocation: out of memory"). Kernels
// (ops.h) never throw: a launch or execution error shows up at the next Stream::synchronize().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace shardline::kernels::cuda {

// Whether this binary contains the CUDA backend.
bool built_with_cuda();

struct DeviceCount {
  int count = 0;
  std::string reason;  // why count is 0 (empty otherwise): built without CUDA, no driver, no device
};

// How many CUDA devices this process can use. Never throws and never crashes: on a machine without an
// NVIDIA driver cudaGetDeviceCount fails with cudaErrorInsufficientDriver, which becomes count 0 and a
// reason that says so.
DeviceCount device_count() noexcept;

// The device a rank uses: one GPU per rank, ranks of a node spread round-robin over its devices
// (local_rank 0..7 on 8 GPUs -> devices 0..7; on 4 GPUs local ranks 4..7 share devices 0..3).
// n_devices must be > 0.
int device_for_local_rank(int local_rank, int n_devices);

struct DeviceProperties {
  int index = 0;
  std::string name;                 // "NVIDIA H100 80GB HBM3"
  int sm_major = 0;                 // compute capability, 9.0 for Hopper
  int sm_minor = 0;
  std::uint64_t memory_bytes = 0;   // total device memory
  int multiprocessors = 0;
  std::string pci_bus_id;           // "0000:17:00.0": what hwloc matches to find the GPU's NUMA node
  int host_numa_node = -1;          // CUDA's own idea of the closest host NUMA node; -1 when unknown
};

// Throws ResourceError for an index out of range or without a driver.
DeviceProperties device_properties(int device);

// Makes `device` current for this host thread (cudaSetDevice). Throws ResourceError.
void select_device(int device);

// A CUDA stream as kernels take it: cudaStream_t is a pointer, carried here without CUDA's headers.
// raw == nullptr is the legacy default stream.
struct StreamRef {
  void* raw = nullptr;
};

enum class StreamPriority { kNormal, kHigh };

// An owned non-blocking stream on the current device. kHigh gets the device's greatest priority: the design
// puts communication there so it overtakes queued compute kernels.
class Stream {
 public:
  explicit Stream(StreamPriority priority = StreamPriority::kNormal);
  // Moves are plain handle moves, the same with and without CUDA (so defined here, once).
  Stream(Stream&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    std::swap(raw_, other.raw_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  StreamRef ref() const { return {raw_}; }
  // Waits for the stream's work; throws ResourceError with CUDA's message if a kernel on it failed.
  void synchronize() const;

 private:
  void* raw_ = nullptr;
};

// One CUDA allocation, freed on destruction; DeviceBuffer and PinnedBuffer below say which kind. Contents
// start unspecified.
class CudaAllocation {
 public:
  enum class Kind { kDevice, kPinnedHost };

  CudaAllocation() = default;
  CudaAllocation(std::size_t bytes, Kind kind);
  // Moves are plain pointer moves, the same with and without CUDA (so defined here, once).
  CudaAllocation(CudaAllocation&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), kind_(other.kind_) {}
  CudaAllocation& operator=(CudaAllocation&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(kind_, other.kind_);
    return *this;
  }
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;
  ~CudaAllocation();

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Kind kind_ = Kind::kDevice;
};

// Device memory (cudaMalloc).
class DeviceBuffer : public CudaAllocation {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : CudaAllocation(bytes, Kind::kDevice) {}
};

// Page-locked host memory (cudaMallocHost): what device<->host copies of activations use, so they run
// asynchronously at full PCIe/NVLink-C2C speed and MPI can send them directly.
class PinnedBuffer : public CudaAllocation {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : CudaAllocation(bytes, Kind::kPinnedHost) {}
};

// Blocking copies (weights at load time, test data).
void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes);
// Stream-ordered copies (activations in the decode loop); host memory should be pinned.
void copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes, StreamRef stream);
void copy_to_host_async(void* host_dst, const void* device_src, std::size_t bytes, StreamRef stream);
void copy_device_to_device_async(void* dst, const void* src, std::size_t bytes, StreamRef stream);
void fill_zero_async(void* device_dst, std::size_t bytes, StreamRef stream);

}  // namespace shardline::kernels::cuda
