// A rank's pool of fixed-size KV cache blocks (a block holds block_tokens positions of one sequence for
// every layer of the rank's stage; the caller decides the layout inside a block).
//
// Memory: one MAP_NORESERVE reservation of n_blocks blocks, made at start-up, costs address space only. A
// block is committed (made writable and faulted in, on the rank's node) the first time it is handed out;
// released blocks go to a free list and are reused before any new block is committed. So resident memory
// follows the largest number of blocks ever in use, not the pool's size.
//
// Exhaustion is not a crash: try_allocate() returns nothing (back-pressure for a scheduler) and allocate()
// throws ResourceError with the pool's counts. Not thread-safe: one rank's pipeline thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardline::memory {

struct KvBlockPoolOptions {
  std::uint64_t block_bytes = 0;  // one block (rounded up to 4 KiB)
  int n_blocks = 0;
  int numa_node = -1;             // bind the pool's memory to this node; -1: no binding
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
  std::uint64_t committed_bytes() const { return block_bytes_ * static_cast<std::uint64_t>(committed_); }
  int numa_node() const { return numa_node_; }
  bool node_bound() const { return node_bound_; }

  // "3 used, 253 free of 256 blocks (peak 5 used; 5 committed = 1.2 MiB of 64.0 MiB reserved, node 0)".
  std::string describe() const;

 private:
  void commit(int block);

  std::byte* base_ = nullptr;
  std::uint64_t block_bytes_ = 0;
  int n_blocks_ = 0;
  int numa_node_ = -1;
  bool node_bound_ = false;
  int committed_ = 0;  // blocks [0, committed_) are committed; higher ones are address space only
  int used_ = 0;
  int peak_used_ = 0;
  std::vector<int> free_;       // committed blocks not in use, reused last-released first
  std::vector<char> in_use_;    // (n_blocks): catches double releases
};

}  // namespace shardline::memory
