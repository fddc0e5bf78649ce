// Which backend runs this rank's stage: --device cpu|cuda|auto turned into a concrete choice. Detection goes
// through kernels::cuda::device_count(), which never throws or crashes without a driver (it returns 0 and
// the reason), so the same binary decides at run time on machines with and without GPUs.
#pragma once

#include <cstdint>
#include <string>

namespace shardline::runtime {

enum class DeviceRequest { kAuto, kCpu, kCuda };

// "auto" | "cpu" | "cuda"; ConfigError naming the accepted values otherwise.
DeviceRequest parse_device_request(const std::string& text);
const char* device_request_name(DeviceRequest request);

struct BackendChoice {
  bool cuda = false;
  int cuda_device = -1;     // the rank's GPU when cuda: device_for_local_rank(local_rank, devices)
  std::string pci_bus_id;   // its PCI bus id ("0000:17:00.0") when cuda: where placement finds its NUMA node
  int driver_numa_node = -1;  // the CUDA driver's idea of its host NUMA node; -1 when unknown
  std::string cpu_reason;   // why auto chose the CPU ("no usable GPU: ..."); empty otherwise
};

// The backend for a rank that is local_rank on its host. cpu: always the CPU. auto: the GPU of this local
// rank when the process sees one and the run can go there (cpu_only_reason empty, and the rank's weights,
// about weight_bytes on the device, take at most 90% of its memory), else the CPU with the reason. cuda: the
// GPU, or ResourceError (exit 4) with the reason and what to do instead (a cpu_only_reason is then the CUDA
// stage's own error to give, when it loads; weights that do not fit fail its allocation, exit 4).
BackendChoice choose_backend(DeviceRequest request, int local_rank, const std::string& cpu_only_reason = "",
                             std::uint64_t weight_bytes = 0);

}  // namespace shardline::runtime
