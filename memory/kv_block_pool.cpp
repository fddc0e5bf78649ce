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

namespace {

bool kernel_allows_thp() {
  const std::string mode = transparent_hugepage_mode();
  return (mode == "always" || mode == "madvise") && !thp_disabled_for_process();
}

}  // namespace

KvBlockPool::KvBlockPool(const KvBlockPoolOptions& options)
    : block_bytes_(round_up(options.block_bytes, kSmallPageBytes)),
      n_blocks_(options.n_blocks),
      numa_node_(options.numa_node) {
  SL_CHECK(options.block_bytes > 0 && options.n_blocks > 0);
  const bool huge = options.transparent_huge_pages && kernel_allows_thp();
  // PROT_NONE + MAP_NORESERVE: address space only; nothing is charged or touched until a block is committed.
  // On THP one more step of address space lets the pool start on a 2 MiB boundary.
  mapping_bytes_ = huge ? round_up(reserved_bytes(), kHugePageBytes) + kHugePageBytes : reserved_bytes();
  mapping_ = mmap(nullptr, mapping_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw ResourceError(fmt::format("cannot reserve {} of address space for {} KV blocks: {}; use fewer --kv-blocks",
                                    format_bytes(static_cast<double>(mapping_bytes_)), n_blocks_, std::strerror(errno)));
  }
  // The destructor does not run for a constructor that throws: whatever fails from here unmaps first.
  try {
    finish_setup(huge);
  } catch (...) {
    munmap(mapping_, mapping_bytes_);
    mapping_ = nullptr;
    throw;
  }
}

void KvBlockPool::finish_setup(bool huge) {
  base_ = static_cast<std::byte*>(mapping_);
  if (huge) {
    const auto at = reinterpret_cast<std::uintptr_t>(mapping_);
    base_ += round_up(at, kHugePageBytes) - at;
    // Without the advice (the kernel's "madvise" mode) the steps would stay 4 KiB pages: keep 4 KiB steps then.
    if (madvise(base_, round_up(reserved_bytes(), kHugePageBytes), MADV_HUGEPAGE) == 0) commit_step_ = kHugePageBytes;
  }
  // The last step may pass the last block: bind all that can be committed.
  const std::uint64_t committable = round_up(reserved_bytes(), commit_step_);
  if (numa_node_ >= 0) node_bound_ = bind_range_to_node(base_, committable, numa_node_, false);
  in_use_.assign(static_cast<std::size_t>(n_blocks_), 0);
  free_.reserve(static_cast<std::size_t>(n_blocks_));
}

KvBlockPool::~KvBlockPool() {
  if (mapping_) munmap(mapping_, mapping_bytes_);
}

void KvBlockPool::commit(int block) {
  const std::uint64_t end = static_cast<std::uint64_t>(block + 1) * block_bytes_;
  if (end <= committed_bytes_) return;  // the last step already covered it
  // The step may pass the last block: the reservation was rounded up to whole steps.
  const std::uint64_t new_end = round_up(end, commit_step_);
  std::byte* at = base_ + committed_bytes_;
  const std::uint64_t bytes = new_end - committed_bytes_;
  if (mprotect(at, bytes, PROT_READ | PROT_WRITE) != 0) {
    throw ResourceError(fmt::format("cannot commit KV block {} ({}): {}", block,
                                    format_bytes(static_cast<double>(bytes)), std::strerror(errno)));
  }
  if (madvise(at, bytes, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    throw ResourceError(fmt::format("cannot fault in KV block {} ({}){}: {}", block,
                                    format_bytes(static_cast<double>(bytes)),
                                    numa_node_ >= 0 ? fmt::format(" on node {}", numa_node_) : "", std::strerror(errno)));
  }
  committed_bytes_ = new_end;
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
  return fmt::format("{} used, {} free of {} blocks (peak {} used; {} committed = {} of {} reserved{}{})", used_,
                     free_blocks(), n_blocks_, peak_used_, committed_, format_bytes(static_cast<double>(committed_bytes())),
                     // A pool smaller than one commit step is committed whole: its reservation is the step.
                     format_bytes(static_cast<double>(std::max(reserved_bytes(), committed_bytes()))),
                     huge_page_steps() ? " in THP steps" : "",
                     numa_node_ < 0 ? "" : node_bound_ ? fmt::format(", node {}", numa_node_) : ", node binding unsupported");
}

}  // namespace shardline::memory
