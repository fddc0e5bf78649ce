#include "memory/kv_block_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "memory/binding.h"
#include "memory/system_memory.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace shardline::memory {

KvBlockPool::KvBlockPool(const KvBlockPoolOptions& options)
    : block_bytes_((options.block_bytes + kSmallPageBytes - 1) / kSmallPageBytes * kSmallPageBytes),
      n_blocks_(options.n_blocks),
      numa_node_(options.numa_node) {
  SL_CHECK(options.block_bytes > 0 && options.n_blocks > 0);
  // PROT_NONE + MAP_NORESERVE: address space only; nothing is charged or touched until a block is committed.
  void* base = mmap(nullptr, reserved_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    throw ResourceError(fmt::format("cannot reserve {} of address space for {} KV blocks: {}; use fewer --kv-blocks",
                                    format_bytes(static_cast<double>(reserved_bytes())), n_blocks_, std::strerror(errno)));
  }
  base_ = static_cast<std::byte*>(base);
  if (numa_node_ >= 0) node_bound_ = bind_range_to_node(base_, reserved_bytes(), numa_node_, false);
  in_use_.assign(static_cast<std::size_t>(n_blocks_), 0);
  free_.reserve(static_cast<std::size_t>(n_blocks_));
}

KvBlockPool::~KvBlockPool() {
  if (base_) munmap(base_, reserved_bytes());
}

void KvBlockPool::commit(int block) {
  std::byte* at = data(block);
  if (mprotect(at, block_bytes_, PROT_READ | PROT_WRITE) != 0) {
    throw ResourceError(fmt::format("cannot commit KV block {} ({}): {}", block,
                                    format_bytes(static_cast<double>(block_bytes_)), std::strerror(errno)));
  }
  if (madvise(at, block_bytes_, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    throw ResourceError(fmt::format("cannot fault in KV block {} ({}) on node {}: {}", block,
                                    format_bytes(static_cast<double>(block_bytes_)), numa_node_, std::strerror(errno)));
  }
}

std::optional<int> KvBlockPool::try_allocate() {
  int block = -1;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (committed_ < n_blocks_) {
    commit(committed_);
    block = committed_++;
  } else {
    return std::nullopt;
  }
  in_use_[block] = 1;
  ++used_;
  peak_used_ = std::max(peak_used_, used_);
  return block;
}

int KvBlockPool::allocate() {
  if (auto block = try_allocate()) return *block;
  throw ResourceError(fmt::format("the KV cache pool is exhausted: all {} blocks ({} each) are in use; raise "
                                  "--kv-blocks or run fewer or shorter sequences",
                                  n_blocks_, format_bytes(static_cast<double>(block_bytes_))));
}

void KvBlockPool::release(int block) {
  SL_CHECK_MSG(block >= 0 && block < committed_ && in_use_[block], "KV block {} released but not in use", block);
  in_use_[block] = 0;
  --used_;
  free_.push_back(block);
}

std::string KvBlockPool::describe() const {
  return fmt::format("{} used, {} free of {} blocks (peak {} used; {} committed = {} of {} reserved{})", used_,
                     free_blocks(), n_blocks_, peak_used_, committed_, format_bytes(static_cast<double>(committed_bytes())),
                     format_bytes(static_cast<double>(reserved_bytes())),
                     numa_node_ < 0 ? "" : node_bound_ ? fmt::format(", node {}", numa_node_) : ", node binding unsupported");
}

}  // namespace shardline::memory
