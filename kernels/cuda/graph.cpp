#include "kernels/cuda/graph.h"

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace shardline::kernels::cuda {

Graph Graph::capture(const Stream& stream, const std::function<void()>& record) {
  const cudaStream_t native_stream = native(stream.ref());
  // Thread-local mode: only this thread's unsafe calls break the capture, other threads' work is unaffected.
  check_cuda(cudaStreamBeginCapture(native_stream, cudaStreamCaptureModeThreadLocal), "graph capture start");
  cudaGraph_t graph = nullptr;
  try {
    record();
  } catch (...) {
    cudaStreamEndCapture(native_stream, &graph);  // leave the stream usable, discard the partial graph
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a capture error is not the next kernel's: the caller may fall back to eager launch
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(native_stream, &graph);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    check_cuda(ended, "graph capture");
  }
  Graph out;
  out.graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  if (instantiated != cudaSuccess) cudaGetLastError();
  check_cuda(instantiated, "graph instantiation");  // out's destructor frees the graph
  out.exec_ = exec;
  return out;
}

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void Graph::launch(StreamRef stream) const {
  // A launch that cannot even be queued (an invalid graph) is a broken invariant of the caller's, and
  // rare enough that reporting it at once beats waiting for the next synchronisation.
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), native(stream)), "graph launch");
}

}  // namespace shardline::kernels::cuda
