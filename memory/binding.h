// Binding on the real host: CPU sets through hwloc (process or calling thread), memory policy through the
// kernel's NUMA calls (libnuma's numaif.h): per thread (set_mempolicy) and per address range (mbind).
// Failures of explicit requests are ResourceErrors with the library's message; a kernel without NUMA
// support is reported (not an error): memory then stays where the kernel puts it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace shardline::memory {

// OS indices of the CPUs the whole process / the calling thread may run on.
std::vector<int> process_cpus();
std::vector<int> this_thread_cpus();
// Binds every thread of the process / the calling thread to these CPUs.
void bind_process_cpus(const std::vector<int>& pus);
void bind_this_thread_cpus(const std::vector<int>& pus);

// The calling thread (and threads it creates later) allocates from node first, falling back to others
// when the node is full (MPOL_PREFERRED: a node's size as the VM reports it may be wrong). Returns false
// (and the reason in why_not) when the kernel has no NUMA support or refuses the call (EPERM: a container's
// seccomp profile).
bool prefer_node_for_this_thread(int node, std::string* why_not = nullptr);

// Binds [address, address + bytes) to node (MPOL_BIND); with move_existing, pages already faulted in and
// mapped only by this process move there (MPOL_MF_MOVE). address must be page aligned. Returns false with
// the reason when the kernel has no NUMA support or refuses the call (as prefer_node_for_this_thread());
// ResourceError for other failures.
bool bind_range_to_node(void* address, std::size_t bytes, int node, bool move_existing, std::string* why_not = nullptr);

// The policy of the range containing address (get_mempolicy with MPOL_F_ADDR), for checks and reports.
struct RangePolicy {
  int mode = 0;            // MPOL_DEFAULT, MPOL_BIND, MPOL_PREFERRED, ...
  std::vector<int> nodes;  // the policy's nodes
};
RangePolicy range_policy(const void* address);
// The node the page holding address is on (it is faulted in if it was not); -1 without NUMA support.
int node_of_page(const void* address);

}  // namespace shardline::memory
