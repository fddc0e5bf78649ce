// What a host looks like, as one plain value built from hwloc: packages, NUMA nodes with the cores they own,
// caches, GPUs, and the CPUs this process may use. Placement (placement.h) is pure math over this value, so
// it is tested on synthetic topologies (hwloc's synthetic descriptions or saved XML files) as well as on the
// real host.
//
// Memory sizes: hwloc's per-NUMA-node memory figure is shown for information only. On virtual machines it
// can be wrong (this project's VM: hwloc reports 5 GiB for its only node while /proc/meminfo has 24 GiB),
// so nothing is sized from it; sizes come from /proc/meminfo (system_memory.h) and from what the arena
// actually obtains.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardline::memory {

struct CoreInfo {
  int index = 0;          // hwloc logical index of the core on this host (0 .. n_cores-1)
  std::vector<int> pus;   // OS indices of its processing units (hardware threads) this process may use
};

struct NumaNodeInfo {
  int os_index = 0;                  // the kernel's node number (what mbind/get_mempolicy use)
  std::vector<CoreInfo> cores;       // cores whose CPUs are local to this node; empty for memory-only nodes
  std::uint64_t hwloc_memory_bytes = 0;  // informational only (see above)
};

struct CacheInfo {
  std::string name;         // "L1d", "L1i", "L2", "L3"
  std::uint64_t size_bytes = 0;  // of one instance
  int count = 0;            // instances on the host
};

// A PCI device hwloc found, with where it is attached: only filled when the topology was loaded with I/O
// discovery (discover_host_topology(true), load_xml_topology(path, true)). GPUs, NICs and storage
// controllers are kept (hwloc's "important" I/O filter); bridges and minor devices are not.
struct PciDeviceInfo {
  std::string bus_id;           // "0000:17:00.0": domain:bus:device.function, lowercase hex, as hwloc prints it
  unsigned class_id = 0;        // PCI class: 0x0300 VGA, 0x0302 3D controller (data-centre GPUs), 0x0200 NIC
  std::string name;             // "NVIDIA Corporation GH100 [H100 SXM5 80GB]" when hwloc knows it
  // OS indices of the NUMA nodes of the device's first non-I/O ancestor (a package, a die, a NUMA group):
  // the memory nearest to it. Every node of the machine when the device hangs off the machine as a whole.
  std::vector<int> numa_nodes;
};

struct HostTopology {
  std::string source;           // "this host", "synthetic 'pack:2 numa:2 core:4 pu:1'", "xml FILE"
  bool is_this_system = false;  // binding is possible only on the real host
  std::string hostname;         // empty for synthetic topologies
  int n_packages = 0;
  int n_cores = 0;
  int n_pus = 0;
  std::vector<NumaNodeInfo> numa_nodes;  // every node, in logical order; each core belongs to exactly one
  std::vector<CacheInfo> caches;         // one entry per cache level and kind
  std::vector<std::string> gpus;         // hwloc OS devices of kind GPU / co-processor: "cuda0 (NVIDIA H100)"
  std::vector<int> allowed_pus;          // OS indices of the PUs this process may run on (cgroup, cpuset)
  std::vector<PciDeviceInfo> pci_devices;  // with I/O discovery only (see PciDeviceInfo); else empty

  // Nodes that own at least one core: where ranks can be placed.
  std::vector<const NumaNodeInfo*> nodes_with_cores() const;
};

// The host this process runs on; with_devices also looks for GPUs (PCI discovery: slower, for reports).
// ResourceError when hwloc fails.
HostTopology discover_host_topology(bool with_devices = true);
// hwloc's synthetic description, e.g. "pack:2 numa:2 core:8 pu:2" (see hwloc's synthetic topology docs).
// ConfigError when hwloc rejects the description.
HostTopology load_synthetic_topology(const std::string& description);
// A topology saved by `lstopo FILE.xml` (e.g. hostfiles/*.xml). ConfigError when it cannot be read.
// with_devices keeps the file's PCI and OS devices (GPUs, pci_devices), as discover_host_topology(true).
HostTopology load_xml_topology(const std::string& path, bool with_devices = false);

// "0-3,8,10-11": a sorted list of integers in the compact form Linux and hwloc print cpusets in.
std::string format_index_list(std::vector<int> values);

}  // namespace shardline::memory
