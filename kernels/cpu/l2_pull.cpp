#include "kernels/cpu/l2_pull.h"

namespace shardline::kernels::cpu {

void L2Pull::reserve(int n_threads, int max_ranges) {
  queues_.resize(static_cast<std::size_t>(n_threads));
  max_ranges_ = max_ranges;
  for (Queue& q : queues_) {
    q.begins.reserve(static_cast<std::size_t>(max_ranges));
    q.sizes.reserve(static_cast<std::size_t>(max_ranges));
  }
  clear();
}

void L2Pull::clear() {
  for (Queue& q : queues_) {
    q.begins.clear();
    q.sizes.clear();
    q.bytes = 0;
    q.range = 0;
    q.offset = 0;
  }
}

bool L2Pull::add(int thread, const void* p, std::size_t bytes) {
  if (thread < 0 || thread >= threads() || bytes == 0) return false;
  Queue& q = queues_[static_cast<std::size_t>(thread)];
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t first = begin & ~std::uintptr_t{63};
  const std::uintptr_t end = (begin + bytes + 63) & ~std::uintptr_t{63};
  const std::size_t lines_bytes = end - first;
  if (static_cast<int>(q.begins.size()) >= max_ranges_ || q.bytes + lines_bytes > kL2PullBudget) return false;
  q.begins.push_back(reinterpret_cast<const char*>(first));
  q.sizes.push_back(static_cast<std::uint32_t>(lines_bytes));
  q.bytes += lines_bytes;
  return true;
}

std::size_t L2Pull::remaining_bytes(int thread) const {
  const Queue& q = queues_[static_cast<std::size_t>(thread)];
  std::size_t left = 0;
  for (std::size_t r = static_cast<std::size_t>(q.range); r < q.sizes.size(); ++r) left += q.sizes[r];
  return left - (static_cast<std::size_t>(q.range) < q.sizes.size() ? q.offset : 0);
}

}  // namespace shardline::kernels::cpu
