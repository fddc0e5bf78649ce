// A CUDA graph: the work one function queues on a stream, recorded once and replayed with one launch. The
// decode step of the CUDA backend is captured this way (launch overhead is most of a small model's step);
// every kernel in ops.h is capture-safe: no allocation, no synchronisation, device-side positions.
#pragma once

#include <functional>

#include "kernels/cuda/device.h"

namespace shardline::kernels::cuda {

class Graph {
 public:
  Graph() = default;
  // Records what `record` queues on `stream` (nothing runs during capture) and instantiates it. Throws
  // ResourceError with CUDA's message when the work is not capturable (e.g. it synchronises).
  static Graph capture(const Stream& stream, const std::function<void()>& record);

  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  // Queues one replay on `stream`. Kernel failures surface at the next Stream::synchronize().
  void launch(StreamRef stream) const;
  bool empty() const { return exec_ == nullptr; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace shardline::kernels::cuda
