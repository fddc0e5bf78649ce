// GPU ranks next to their GPUs (issue #8): PCI bus ids as CUDA prints them, the NUMA node hwloc reports for
// each GPU of a saved topology with PCI devices (hostfiles/topo-2socket-4gpu.xml: two sockets of 4 cores,
// GPUs 0000:17:00.0 and 0000:2a:00.0 on node 0, 0000:b1:00.0 and 0000:ca:00.0 on node 1, 0000:03:00.0 on the
// machine as a whole), and the cores each rank gets. No GPU is needed: the topology is read from the file.
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "memory/device_locality.h"
#include "memory/placement.h"
#include "memory/topology.h"

namespace shardline::memory {
namespace {

HostTopology four_gpu_host() {
  return load_xml_topology(std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/topo-2socket-4gpu.xml",
                           /*with_devices=*/true);
}

TEST(PciBusId, ParsesTheFormsCudaHwlocAndNvidiaSmiPrint) {
  EXPECT_EQ(PciBusId::parse("0000:B1:00.0").str(), "0000:b1:00.0");      // cudaDeviceGetPCIBusId
  EXPECT_EQ(PciBusId::parse("00000000:b1:00.0").str(), "0000:b1:00.0");  // nvidia-smi
  EXPECT_EQ(PciBusId::parse("b1:00.0").str(), "0000:b1:00.0");           // lspci
  EXPECT_EQ(PciBusId::parse("0001:03:1f.7"), (PciBusId{1, 3, 0x1f, 7}));
  for (const std::string bad : {"", "gpu0", "0000:b1:00", "0000:b1:00.0x", "0000:100:00.0", "0000:b1:20.0"}) {
    EXPECT_THROW(PciBusId::parse(bad), ConfigError) << bad;
  }
}

TEST(DeviceLocality, XmlWithDevicesListsEveryGpuWithItsNodes) {
  const HostTopology host = four_gpu_host();
  ASSERT_EQ(host.nodes_with_cores().size(), 2u);
  EXPECT_EQ(host.gpus.size(), 5u);
  ASSERT_EQ(host.pci_devices.size(), 5u);
  for (const auto& d : host.pci_devices) EXPECT_EQ(d.class_id, 0x0302u) << d.bus_id;
  EXPECT_EQ(host.pci_devices.front().bus_id, "0000:17:00.0");
  EXPECT_EQ(host.pci_devices.front().numa_nodes, std::vector<int>{0});
  EXPECT_EQ(host.pci_devices.front().name, "NVIDIA Corporation GH100 [H100 SXM5 80GB]");
  // Without I/O discovery the same file has no devices (what placement of CPU ranks reads).
  const HostTopology plain = load_xml_topology(std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/topo-2socket-4gpu.xml");
  EXPECT_TRUE(plain.pci_devices.empty());
  EXPECT_TRUE(plain.gpus.empty());
}

TEST(DeviceLocality, EachGpuMapsToTheNodeOfItsSocket) {
  const HostTopology host = four_gpu_host();
  EXPECT_EQ(device_numa_node(host, "0000:17:00.0").numa_node, 0);
  EXPECT_EQ(device_numa_node(host, "0000:2A:00.0").numa_node, 0);
  EXPECT_EQ(device_numa_node(host, "0000:B1:00.0").numa_node, 1);
  EXPECT_EQ(device_numa_node(host, "00000000:ca:00.0").numa_node, 1);
  EXPECT_EQ(device_numa_node(host, "0000:b1:00.0").note, "GPU 0000:b1:00.0 is on NUMA node 1");
}

TEST(DeviceLocality, NoSingleNodeOrUnknownDeviceGivesNoNodeAndSaysWhy) {
  const HostTopology host = four_gpu_host();
  const DeviceNumaNode machine_wide = device_numa_node(host, "0000:03:00.0");
  EXPECT_EQ(machine_wide.numa_node, -1);
  EXPECT_NE(machine_wide.note.find("attached to NUMA nodes 0-1 alike"), std::string::npos) << machine_wide.note;
  const DeviceNumaNode missing = device_numa_node(host, "0000:99:00.0");
  EXPECT_EQ(missing.numa_node, -1);
  EXPECT_NE(missing.note.find("not among the 5 PCI devices"), std::string::npos) << missing.note;
  // The driver's own idea of the node is used only when hwloc has none, and only if it names a node with cores.
  EXPECT_EQ(device_numa_node(host, "0000:99:00.0", 1).numa_node, 1);
  EXPECT_EQ(device_numa_node(host, "0000:03:00.0", 0).numa_node, 0);
  EXPECT_EQ(device_numa_node(host, "0000:03:00.0", 7).numa_node, -1);
  EXPECT_EQ(device_numa_node(host, "0000:17:00.0", 1).numa_node, 0);  // hwloc wins
  EXPECT_THROW(device_numa_node(host, "not-a-bus-id"), ConfigError);
}

TEST(DeviceLocality, TopologyWithoutDevicesKnowsNoGpu) {
  const HostTopology host = load_synthetic_topology("pack:2 numa:1 core:4 pu:1");
  EXPECT_EQ(device_numa_node(host, "0000:17:00.0").numa_node, -1);
}

// The node of each local rank's GPU when local rank r drives the r-th listed GPU.
std::vector<int> gpu_nodes(const HostTopology& host, const std::vector<std::string>& bus_ids) {
  std::vector<int> out;
  for (const auto& id : bus_ids) out.push_back(device_numa_node(host, id).numa_node);
  return out;
}

TEST(GpuPlacement, RanksRunOnTheSocketOfTheirGpuAndSplitItsCores) {
  const HostTopology host = four_gpu_host();
  // GPUs listed in the order a driver might enumerate them: both node-1 GPUs first.
  const auto nodes = gpu_nodes(host, {"0000:b1:00.0", "0000:ca:00.0", "0000:17:00.0", "0000:2a:00.0"});
  ASSERT_EQ(nodes, (std::vector<int>{1, 1, 0, 0}));
  const std::vector<std::vector<int>> expected_cores = {{4, 5}, {6, 7}, {0, 1}, {2, 3}};
  std::set<int> seen;
  for (int r = 0; r < 4; ++r) {
    const RankPlacement p = plan_gpu_placement(host, r, nodes, BindMode::kAuto);
    EXPECT_EQ(p.numa_node, nodes[r]) << "rank " << r;
    EXPECT_EQ(p.applied, BindMode::kCore);
    EXPECT_EQ(p.ranks_on_node, 2);
    EXPECT_EQ(p.core_indices(), expected_cores[r]) << "rank " << r;
    EXPECT_EQ(p.pus, expected_cores[r]);  // one PU per core in this topology
    EXPECT_TRUE(p.note.empty()) << p.note;
    for (int pu : p.pus) EXPECT_TRUE(seen.insert(pu).second);
  }
  // The CPU spread would have put ranks 0-1 on node 0: the GPU placement differs exactly where it should.
  EXPECT_EQ(plan_placement(host, 0, 4, BindMode::kAuto).numa_node, 0);
}

TEST(GpuPlacement, UnevenRanksPerGpuNodeAndTheBindModes) {
  const HostTopology host = four_gpu_host();
  // Three ranks on node 0's GPUs, one on node 1: the three split node 0's 4 cores 1/1/2, the fourth has node 1.
  const std::vector<int> nodes = {0, 0, 1, 0};
  EXPECT_EQ(plan_gpu_placement(host, 0, nodes, BindMode::kCore).core_indices(), (std::vector<int>{0}));
  EXPECT_EQ(plan_gpu_placement(host, 1, nodes, BindMode::kCore).core_indices(), (std::vector<int>{1}));
  EXPECT_EQ(plan_gpu_placement(host, 3, nodes, BindMode::kCore).core_indices(), (std::vector<int>{2, 3}));
  EXPECT_EQ(plan_gpu_placement(host, 2, nodes, BindMode::kCore).core_indices(), (std::vector<int>{4, 5, 6, 7}));
  const RankPlacement numa = plan_gpu_placement(host, 1, nodes, BindMode::kNuma);
  EXPECT_EQ(numa.applied, BindMode::kNuma);
  EXPECT_EQ(numa.core_indices(), (std::vector<int>{0, 1, 2, 3}));
  const RankPlacement none = plan_gpu_placement(host, 2, nodes, BindMode::kNone);
  EXPECT_EQ(none.applied, BindMode::kNone);
  EXPECT_EQ(none.numa_node, -1);
  // Five ranks on node 0 cannot have a core each: core fails with the usual message, auto shares the node.
  const std::vector<int> crowded = {0, 0, 0, 0, 0};
  EXPECT_THROW(plan_gpu_placement(host, 0, crowded, BindMode::kCore), ConfigError);
  EXPECT_EQ(plan_gpu_placement(host, 4, crowded, BindMode::kAuto).applied, BindMode::kNuma);
}

TEST(GpuPlacement, AnyUnknownGpuNodeFallsBackToTheCpuSpreadWithANote) {
  const HostTopology host = four_gpu_host();
  const auto nodes = gpu_nodes(host, {"0000:b1:00.0", "0000:03:00.0"});  // the second has no single node
  ASSERT_EQ(nodes, (std::vector<int>{1, -1}));
  for (int r = 0; r < 2; ++r) {
    const RankPlacement p = plan_gpu_placement(host, r, nodes, BindMode::kAuto);
    const RankPlacement spread = plan_placement(host, r, 2, BindMode::kAuto);
    EXPECT_EQ(p.numa_node, spread.numa_node);
    EXPECT_EQ(p.pus, spread.pus);
    EXPECT_NE(p.note.find("the GPU of local rank 1 has no known NUMA node"), std::string::npos) << p.note;
  }
  // A node number that is not a node with cores counts as unknown too.
  EXPECT_EQ(plan_gpu_placement(host, 0, {5, 1}, BindMode::kAuto).numa_node, 0);
}

}  // namespace
}  // namespace shardline::memory
