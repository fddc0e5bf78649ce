#include "memory/device_locality.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::memory {

PciBusId PciBusId::parse(const std::string& text) {
  PciBusId id;
  char tail = 0;
  // Hex fields; sscanf's %x accepts either case, but also signs and "0x", which no bus id has.
  const bool plain = !text.empty() && text.find_first_not_of("0123456789abcdefABCDEF:.") == std::string::npos;
  // The 3-field form has no domain (domain 0).
  const bool full = plain && std::sscanf(text.c_str(), "%x:%x:%x.%x%c", &id.domain, &id.bus, &id.device, &id.function, &tail) == 4;
  if (!full) {
    id = {};
    tail = 0;
    const bool short_form = plain && std::sscanf(text.c_str(), "%x:%x.%x%c", &id.bus, &id.device, &id.function, &tail) == 3;
    if (!short_form) {
      throw ConfigError(fmt::format("'{}' is not a PCI bus id (expected domain:bus:device.function in hex, e.g. "
                                    "0000:b1:00.0)",
                                    text));
    }
  }
  if (id.bus > 0xff || id.device > 0x1f || id.function > 0x7) {
    throw ConfigError(fmt::format("'{}' is not a PCI bus id (bus <= ff, device <= 1f, function <= 7)", text));
  }
  return id;
}

std::string PciBusId::str() const { return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, device, function); }

namespace {

bool node_has_cores(const HostTopology& host, int os_index) {
  const auto nodes = host.nodes_with_cores();
  return std::any_of(nodes.begin(), nodes.end(), [&](const NumaNodeInfo* n) { return n->os_index == os_index; });
}

// Falls back to the driver's idea of the node when hwloc has none.
DeviceNumaNode without_hwloc_node(const HostTopology& host, std::string why, int driver_hint) {
  if (driver_hint >= 0 && node_has_cores(host, driver_hint)) {
    return {driver_hint, fmt::format("{}; the CUDA driver places it on NUMA node {}", why, driver_hint)};
  }
  return {-1, std::move(why)};
}

}  // namespace

DeviceNumaNode device_numa_node(const HostTopology& host, const std::string& bus_id, int driver_hint) {
  const PciBusId wanted = PciBusId::parse(bus_id);
  const auto found = std::find_if(host.pci_devices.begin(), host.pci_devices.end(), [&](const PciDeviceInfo& d) {
    return PciBusId::parse(d.bus_id) == wanted;
  });
  if (found == host.pci_devices.end()) {
    return without_hwloc_node(
        host,
        fmt::format("GPU {} is not among the {} PCI devices hwloc found in {}", wanted.str(), host.pci_devices.size(),
                    host.source),
        driver_hint);
  }
  std::vector<int> with_cores;
  for (int node : found->numa_nodes) {
    if (node_has_cores(host, node)) with_cores.push_back(node);
  }
  if (with_cores.size() == 1) {
    return {with_cores.front(), fmt::format("GPU {} is on NUMA node {}", wanted.str(), with_cores.front())};
  }
  if (with_cores.empty()) {
    return without_hwloc_node(host, fmt::format("hwloc gives GPU {} no NUMA locality", wanted.str()), driver_hint);
  }
  return without_hwloc_node(host,
                            fmt::format("GPU {} is attached to NUMA nodes {} alike, so no node is nearer", wanted.str(),
                                        format_index_list(with_cores)),
                            driver_hint);
}

}  // namespace shardline::memory
