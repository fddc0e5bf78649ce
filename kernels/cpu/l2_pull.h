// Memory a matmul pulls into each kernel thread's L2 cache while it multiplies: byte ranges per thread,
// fetched a few 64-byte lines after each k block of the tile kernels.
//
// Why: at batch 16 the decode step's attention reads every sequence's cached keys and values, and the
// weights of the layer before have pushed them out of the caches. Attention cannot overlap those misses
// with its own arithmetic (a core keeps only so many misses in flight; measured on the 110M shape: the
// cache's lines cost as long again as attention's arithmetic, 0.55-0.65 ms of a 1.2 ms phase). The qkv
// matmul just before it is bound by the tile unit, not by its memory traffic, so it can fetch them on the
// side: the stage queues, for each thread, the rows its attention will read (runtime/stage.cpp).
//
// Advisory: the AMX kernels pull (where the batch takes them, 4 rows or more for int8); the other kernels
// ignore the queue. Pulling never changes a result. Holds at most kL2PullBudget bytes per thread, so it
// does not push out what it pulled; what does not fit is read by attention as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardline::kernels::cpu {

// Half the 2 MiB L2 of a Sapphire Rapids core, and within the 1-1.25 MiB of older AVX-512 server cores: the
// weights streaming through the same cache keep the other half.
inline constexpr std::size_t kL2PullBudget = std::size_t{1} << 20;

class L2Pull {
 public:
  // Storage for n_threads queues of up to max_ranges ranges each (allocates; nothing after it does).
  void reserve(int n_threads, int max_ranges);
  int threads() const { return static_cast<int>(queues_.size()); }
  int max_ranges() const { return max_ranges_; }
  // Empties every queue.
  void clear();
  // Queues [p, p + bytes) for thread's next pulls, whole 64-byte lines. False (nothing queued) once the
  // thread's budget or its ranges are used up.
  bool add(int thread, const void* p, std::size_t bytes);
  std::size_t queued_bytes(int thread) const { return queues_[thread].bytes; }

  // For matmul: thread's ranges, and how far the kernels have pulled them (range index, byte offset in it).
  struct Queue {
    std::vector<const char*> begins;   // line-aligned
    std::vector<std::uint32_t> sizes;  // whole lines
    std::size_t bytes = 0;             // queued in all
    int range = 0;                     // pulled: ranges [0, range) and `offset` bytes of range
    std::uint32_t offset = 0;
  };
  Queue& queue(int thread) { return queues_[thread]; }
  // Bytes of thread's queue not pulled yet.
  std::size_t remaining_bytes(int thread) const;

 private:
  std::vector<Queue> queues_;
  int max_ranges_ = 0;
};

}  // namespace shardline::kernels::cpu
