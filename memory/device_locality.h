// Which NUMA node a PCI device (a rank's GPU) is attached to, from the hwloc topology: the rank that drives
// the GPU runs and keeps its host memory (pinned staging buffers, the mapped checkpoint) there, so copies to
// and from the device do not cross the socket interconnect.
//
// The device is named by its PCI bus id, the string CUDA gives (cudaDeviceGetPCIBusId: "0000:B1:00.0") and
// hwloc matches; memory/ never includes CUDA (kernels::cuda::DeviceProperties::pci_bus_id supplies it).
//
// Example, hostfiles/topo-2socket-4gpu.xml (two sockets of 4 cores, two GPUs on each):
//   0000:17:00.0 -> node 0   0000:2a:00.0 -> node 0   0000:b1:00.0 -> node 1   0000:ca:00.0 -> node 1
//   0000:03:00.0 -> none: attached to the machine as a whole (both nodes), so no node is nearer
//   0000:99:00.0 -> none: not in the topology
#pragma once

#include <string>

#include "memory/topology.h"

namespace shardline::memory {

struct PciBusId {
  unsigned domain = 0, bus = 0, device = 0, function = 0;

  // "0000:b1:00.0", "0000:B1:00.0", "00000000:b1:00.0" (nvidia-smi's 8-digit domain) or "b1:00.0" (domain 0).
  // ConfigError naming the expected form otherwise.
  static PciBusId parse(const std::string& text);
  std::string str() const;  // "0000:b1:00.0"
  bool operator==(const PciBusId&) const = default;
};

struct DeviceNumaNode {
  int numa_node = -1;  // OS index of the node with cores the device is local to; -1 when there is none
  std::string note;    // where it was found ("GPU 0000:b1:00.0 is on NUMA node 1"), or why no node
};

// The node a device with bus id bus_id is local to. host must have been loaded with I/O discovery
// (HostTopology::pci_devices). A node is returned only when exactly one node with cores is local to the
// device (memory-only nodes, HBM or CXL, next to it are ignored). No node, with the reason in note, when the
// device is not in the topology, hangs off the whole machine, or hwloc gives it no locality; driver_hint
// (CUDA's cudaDevAttrHostNumaId, -1 when unknown) is then used if it names a node with cores.
// ConfigError when bus_id is malformed.
DeviceNumaNode device_numa_node(const HostTopology& host, const std::string& bus_id, int driver_hint = -1);

}  // namespace shardline::memory
