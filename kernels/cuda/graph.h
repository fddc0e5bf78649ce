// A CUDA graph: the work one function queues on a stream, recorded once and replayed with one launch. The
// decode step of the CUDA backend is captured this way (launch overhead is most of a small model's step);
// every kernel in ops.h is capture-safe: no allocation, no synchronisation, device-side positions.
#pragma once

#include <functional>
#include <utility>

#include "kernels/cuda/device.h"

namespace shardline::kernels::cuda {

class Graph {
 public:
  Graph() = default;
  // Records what `record` queues on `stream` (nothing runs during capture) and instantiates it. Throws
  // ResourceError with CUDA's message when the work is not capturable (e.g. it synchronises).
  static Graph capture(const Stream& stream, const std::function<void()>& record);

  // Moves are plain handle moves, the same with and without CUDA (so defined here, once).
  Graph(Graph&& other) noexcept
      : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}
  Graph& operator=(Graph&& other) noexcept {
    std::swap(graph_, other.graph_);
    std::swap(exec_, other.exec_);
    return *this;
  }
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
