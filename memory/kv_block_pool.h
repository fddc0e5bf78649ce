// A rank's pool of fixed-size KV cache blocks (a block holds block_tokens positions of one sequence for
// every layer of the rank's stage; the caller decides the layout inside a block).
//
// Memory: one MAP_NORESERVE reservation of n_blocks blocks, made at start-up, costs address space only. A
// block is committed (made writable and faulted in, on the rank's node) the first time it is handed out;
// released blocks go to a free list and are reused before any new block is committed. So resident memory
// follows the largest number of blocks ever in use, not the pool's size.
//
// Transparent hugepages (KvBlockPoolOptions::transparent_huge_pages, where the kernel allows THP): the
// reservation starts on a 2 MiB boundary and memory is committed in whole 2 MiB steps, so the kernel backs
// it with huge pages; up to one step beyond the last block handed out is then resident. Why: attention reads
// a few KiB per position from rows spread over many blocks, and with 4 KiB pages nearly every row was a TLB
// miss (measured: a batch-16 decode step's attention took a quarter less time on huge pages). The price:
// a step's first commit waits while the kernel finds (compacts) a free 2 MiB range, about 4 ms per step on
// the project VM against well under 1 ms for 4 KiB pages, once per growth of the pool.
//
// Exhaustion is not a crash: try_allocate() returns nothing (back-pressure for a scheduler) and allocate()
// throws ResourceError with the pool's counts. Not thread-safe: one rank's pipeline thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory/system_memory.h"

namespace shardline::memory {

struct KvBlockPoolOptions {
  std::uint64_t block_bytes = 0;  // one block (rounded up to 4 KiB)
  int n_blocks = 0;
  int numa_node = -1;             // bind the pool's memory to this node; -1: no binding
  bool transparent_huge_pages = false;  // commit in 2 MiB steps on THP where the kernel allows (see above)
};

class KvBlockPool {
 public:
  explicit KvBlockPool(const KvBlockPoolOptions& options);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;
  ~KvBlockPool();

  // A free block's id, or nullopt when every block is in use. A block's contents are unspecified.
  std::optional<int> try_allocate();
  // Like try_allocate, but exhaustion is a ResourceError naming the pool's size.
  int allocate();
  void release(int block);

  std::byte* data(int block) const { return base_ + static_cast<std::uint64_t>(block) * block_bytes_; }

  int n_blocks() const { return n_blocks_; }
  int used_blocks() const { return used_; }
  int free_blocks() const { return n_blocks_ - used_; }
  int peak_used_blocks() const { return peak_used_; }
  int committed_blocks() const { return committed_; }
  std::uint64_t block_bytes() const { return block_bytes_; }
  std::uint64_t reserved_bytes() const { return block_bytes_ * static_cast<std::uint64_t>(n_blocks_); }
  // Memory made writable and faulted in: the committed blocks, rounded up to the commit step.
  std::uint64_t committed_bytes() const { return committed_bytes_; }
  // True when the pool commits in 2 MiB steps with MADV_HUGEPAGE (asked for, and the kernel allows THP).
  bool huge_page_steps() const { return commit_step_ == kHugePageBytes; }
  int numa_node() const { return numa_node_; }
  bool node_bound() const { return node_bound_; }

  // "3 used, 253 free of 256 blocks (peak 5 used; 5 committed = 1.2 MiB of 64.0 MiB reserved, node 0)".
  std::string describe() const;

 private:
  void commit(int block);
  // The constructor's steps after the reservation (alignment, THP advice, binding, bookkeeping).
  void finish_setup(bool huge);
  std::byte* base_ = nullptr;
  void* mapping_ = nullptr;           // what munmap takes back (base_ may sit above it, 2 MiB aligned)
  std::uint64_t mapping_bytes_ = 0;
  std::uint64_t commit_step_ = kSmallPageBytes;  // or kHugePageBytes on THP
  std::uint64_t committed_bytes_ = 0; // [base_, base_ + committed_bytes_) is writable
  std::uint64_t block_bytes_ = 0;
  int n_blocks_ = 0;
  int numa_node_ = -1;
  bool node_bound_ = false;
  int committed_ = 0;  // blocks [0, committed_) have been handed out; higher ones never were
  int used_ = 0;
  int peak_used_ = 0;
  std::vector<int> free_;       // committed blocks not in use, reused last-released first
  std::vector<char> in_use_;    // (n_blocks): catches double releases
};

}  // namespace shardline::memory
