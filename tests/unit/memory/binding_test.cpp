// NUMA memory binding where the kernel refuses the memory-policy calls. Docker's and containerd's default
// seccomp profiles answer mbind and set_mempolicy with EPERM in a container without CAP_SYS_NICE; a rank
// there used to fail at start-up ("set_mempolicy(preferred node 0) failed: Operation not permitted") where
// it can run with its memory unbound. The test installs the same kind of seccomp filter in a child process.
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>

#include <gtest/gtest.h>

#include "memory/arena.h"
#include "memory/binding.h"
#include "memory/kv_block_pool.h"

namespace shardline::memory {
namespace {

// mbind and set_mempolicy fail with EPERM from here on in this process; every other call is allowed.
bool refuse_memory_policy_calls() {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mbind, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_set_mempolicy, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
  };
  struct sock_fprog program = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// Runs check() in a child process under the filter; its exit status: 0 passed, 1 the filter could not be
// installed, 2 and up a failed step (check's own codes).
int status_under_filter(int (*check)()) {
  const pid_t pid = fork();
  if (pid == 0) _exit(refuse_memory_policy_calls() ? check() : 1);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int unbound_with_a_reason() {
  try {
    std::string why;
    if (prefer_node_for_this_thread(0, &why)) return 2;
    if (why.find("not permitted") == std::string::npos || why.find("CAP_SYS_NICE") == std::string::npos) return 3;
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::string range_why;
    if (page == MAP_FAILED || bind_range_to_node(page, 4096, 0, false, &range_why)) return 4;
    if (range_why != why) return 5;
    return 0;
  } catch (...) {
    return 6;  // the old behaviour: a ResourceError
  }
}

int arena_and_pool_work_unbound() {
  try {
    Arena arena({.initial_bytes = 2ull << 20, .numa_node = 0, .pages = PagePolicy::kSmall});
    auto* bytes = static_cast<unsigned char*>(arena.allocate_bytes(4096));
    bytes[4095] = 7;
    if (arena.node_bound() || bytes[4095] != 7) return 2;
    KvBlockPool pool({.block_bytes = 64 << 10, .n_blocks = 4, .numa_node = 0});
    if (pool.node_bound()) return 3;
    return 0;
  } catch (...) {
    return 4;
  }
}

TEST(Binding, RefusedMemoryPolicyCallsLeaveMemoryUnboundWithTheReason) {
  EXPECT_EQ(status_under_filter(unbound_with_a_reason), 0);
}

TEST(Binding, ArenaAndKvPoolRunUnboundWhereBindingIsRefused) {
  EXPECT_EQ(status_under_filter(arena_and_pool_work_unbound), 0);
}

}  // namespace
}  // namespace shardline::memory
