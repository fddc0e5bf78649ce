#include "runtime/backend_choice.h"

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "kernels/cuda/device.h"

namespace shardline::runtime {

DeviceRequest parse_device_request(const std::string& text) {
  if (text == "auto") return DeviceRequest::kAuto;
  if (text == "cpu") return DeviceRequest::kCpu;
  if (text == "cuda") return DeviceRequest::kCuda;
  throw ConfigError(fmt::format("--device expects cpu, cuda or auto; got '{}'", text));
}

const char* device_request_name(DeviceRequest request) {
  switch (request) {
    case DeviceRequest::kAuto: return "auto";
    case DeviceRequest::kCpu: return "cpu";
    case DeviceRequest::kCuda: return "cuda";
  }
  return "?";
}

BackendChoice choose_backend(DeviceRequest request, int local_rank, const std::string& cpu_only_reason,
                             std::uint64_t weight_bytes) {
  BackendChoice choice;
  if (request == DeviceRequest::kCpu) return choice;
  if (request == DeviceRequest::kAuto && !cpu_only_reason.empty()) {
    choice.cpu_reason = cpu_only_reason;
    return choice;
  }
  const kernels::cuda::DeviceCount devices = kernels::cuda::device_count();
  if (devices.count > 0) {
    choice.cuda = true;
    choice.cuda_device = kernels::cuda::device_for_local_rank(local_rank, devices.count);
    const kernels::cuda::DeviceProperties properties = kernels::cuda::device_properties(choice.cuda_device);
    // A quantised file held in fp32 on the device takes several times its bytes: auto keeps a model that
    // would not fit (with the KV cache beside it) on the CPU rather than fail in the upload.
    if (request == DeviceRequest::kAuto && static_cast<double>(weight_bytes) > 0.9 * properties.memory_bytes) {
      choice = {};
      choice.cpu_reason = fmt::format("the rank's weights take about {} on the GPU, more than 90% of its {} (fewer "
                                      "bytes: --weights-dtype bf16, or more ranks)",
                                      format_bytes(static_cast<double>(weight_bytes)),
                                      format_bytes(static_cast<double>(properties.memory_bytes)));
      return choice;
    }
    choice.pci_bus_id = properties.pci_bus_id;
    choice.driver_numa_node = properties.host_numa_node;
    return choice;
  }
  if (request == DeviceRequest::kCuda) {
    throw ResourceError(fmt::format("--device cuda: no usable GPU ({}); run with --device cpu or --device auto",
                                    devices.reason));
  }
  choice.cpu_reason = fmt::format("no usable GPU ({})", devices.reason);
  return choice;
}

}  // namespace shardline::runtime
