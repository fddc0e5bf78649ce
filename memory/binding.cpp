#include "memory/binding.h"

#include <numaif.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "memory/hwloc_handle.h"

namespace shardline::memory {

namespace {

using detail::check_hwloc;
using detail::this_host;

std::vector<int> get_cpubind(int flags) {
  detail::BitmapPtr set(hwloc_bitmap_alloc());
  check_hwloc(hwloc_get_cpubind(this_host().get(), set.get(), flags), "get_cpubind");
  return detail::to_indices(set.get());
}

void set_cpubind(const std::vector<int>& pus, int flags) {
  SL_CHECK(!pus.empty());
  const detail::BitmapPtr set = detail::to_bitmap(pus);
  check_hwloc(hwloc_set_cpubind(this_host().get(), set.get(), flags), "set_cpubind");
}

constexpr unsigned long kMaxNodes = 1024;  // node mask bits passed to the kernel
using NodeMask = unsigned long[kMaxNodes / (8 * sizeof(unsigned long))];

void set_node(NodeMask& mask, int node) {
  SL_CHECK(node >= 0 && node < static_cast<int>(kMaxNodes));
  std::memset(mask, 0, sizeof(NodeMask));
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
}

// Why memory cannot be bound at all, for the errors that mean so, else empty (a real failure). Docker's and
// containerd's default seccomp profiles refuse mbind and set_mempolicy (EPERM) to a container without
// CAP_SYS_NICE: the rank then runs with its memory unbound, as on a kernel without NUMA support, rather
// than not at all.
std::string numa_unavailable(int error) {
  if (error == ENOSYS) return "the kernel has no NUMA support";
  if (error == EPERM) {
    return "the NUMA memory-policy calls are not permitted here (a container's seccomp profile refuses them without "
           "CAP_SYS_NICE)";
  }
  return {};
}

}  // namespace

std::vector<int> process_cpus() { return get_cpubind(HWLOC_CPUBIND_PROCESS); }
std::vector<int> this_thread_cpus() { return get_cpubind(HWLOC_CPUBIND_THREAD); }
void bind_process_cpus(const std::vector<int>& pus) { set_cpubind(pus, HWLOC_CPUBIND_PROCESS); }
void bind_this_thread_cpus(const std::vector<int>& pus) { set_cpubind(pus, HWLOC_CPUBIND_THREAD); }

bool prefer_node_for_this_thread(int node, std::string* why_not) {
  NodeMask mask;
  set_node(mask, node);
  if (set_mempolicy(MPOL_PREFERRED, mask, kMaxNodes) == 0) return true;
  const int error = errno;
  if (std::string reason = numa_unavailable(error); !reason.empty()) {
    if (why_not) *why_not = std::move(reason);
    return false;
  }
  throw ResourceError(fmt::format("set_mempolicy(preferred node {}) failed: {}", node, std::strerror(error)));
}

bool bind_range_to_node(void* address, std::size_t bytes, int node, bool move_existing, std::string* why_not) {
  NodeMask mask;
  set_node(mask, node);
  if (mbind(address, bytes, MPOL_BIND, mask, kMaxNodes, move_existing ? MPOL_MF_MOVE : 0) == 0) return true;
  const int error = errno;
  if (std::string reason = numa_unavailable(error); !reason.empty()) {
    if (why_not) *why_not = std::move(reason);
    return false;
  }
  throw ResourceError(fmt::format("mbind of {} bytes to NUMA node {} failed: {}", bytes, node, std::strerror(error)));
}

RangePolicy range_policy(const void* address) {
  RangePolicy policy;
  NodeMask mask;
  std::memset(mask, 0, sizeof(mask));
  if (get_mempolicy(&policy.mode, mask, kMaxNodes, const_cast<void*>(address), MPOL_F_ADDR) != 0) {
    throw ResourceError(fmt::format("get_mempolicy failed: {}", std::strerror(errno)));
  }
  for (unsigned long n = 0; n < kMaxNodes; ++n) {
    if (mask[n / (8 * sizeof(unsigned long))] & (1ul << (n % (8 * sizeof(unsigned long))))) {
      policy.nodes.push_back(static_cast<int>(n));
    }
  }
  return policy;
}

int node_of_page(const void* address) {
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, const_cast<void*>(address), MPOL_F_NODE | MPOL_F_ADDR) != 0) return -1;
  return node;
}

}  // namespace shardline::memory
