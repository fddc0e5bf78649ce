// A counting C allocator for tests of "no allocation in the decode loop": it replaces malloc, calloc,
// realloc and the aligned allocators in the test binary (the dynamic linker resolves every library's calls to
// them here), so it counts operator new (libstdc++'s calls malloc) and what libraries allocate on their own:
// OpenMP's teams (a parallel pragma entered inside a kernel pass allocates one per call), MPI's buffers.
// Include it in exactly one source file of a test binary: it defines the allocator's symbols.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>

namespace shardline::test {
inline std::atomic<long> g_allocations{0};
// Allocations made by this process so far.
inline long allocations() { return g_allocations.load(std::memory_order_relaxed); }
}  // namespace shardline::test

// glibc's own implementations, under the names it exports for allocators that wrap them.
extern "C" {
void* __libc_malloc(std::size_t bytes);
void* __libc_calloc(std::size_t count, std::size_t bytes);
void* __libc_realloc(void* p, std::size_t bytes);
void* __libc_memalign(std::size_t alignment, std::size_t bytes);
void __libc_free(void* p);

void* malloc(std::size_t bytes) noexcept {
  shardline::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(bytes);
}
void* calloc(std::size_t count, std::size_t bytes) noexcept {
  shardline::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(count, bytes);
}
void* realloc(void* p, std::size_t bytes) noexcept {
  shardline::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(p, bytes);
}
void* memalign(std::size_t alignment, std::size_t bytes) noexcept {
  shardline::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(alignment, bytes);
}
void* aligned_alloc(std::size_t alignment, std::size_t bytes) noexcept {
  shardline::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(alignment, bytes);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t bytes) noexcept {
  shardline::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = __libc_memalign(alignment, bytes);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) noexcept { __libc_free(p); }
}
