// The CUDA backend of one rank's forward pass (StageBackend), built from kernels/cuda/ops.h in every build:
// without CUDA, make_cuda_stage throws the kernels' ResourceError "built without CUDA" (the launcher never
// asks for it then: --device auto picks the CPU first).
//
// Weights: every matrix of the rank's own slices is uploaded once from the mapped checkpoint (fp32 or bf16;
// the TP column slices of wo and w2 through a row stride, without a host repack). The token embedding
// stays a host mapping: embed() copies rows on the host, as the activations enter on the host anyway.
// KV: a device pool with the host KvCache's block ids (a small host id pool does the bookkeeping).
// Per forward call: x goes to the device, every layer runs there (RMSNorm, cuBLAS matmuls, RoPE, paged
// attention, SwiGLU, residual adds; TP all-reduces through NCCL on device buffers), and x comes back; the
// host waits once per call, at the end.
//
// Communication: the TP all-reduces run on NCCL's high-priority stream, ordered against the compute stream
// by events (no host round trip per all-reduce). Calls of at least overlap_min_rows rows (prefill chunks)
// are split into two halves of rows, software-pipelined: the all-reduce of one half runs while the other
// half computes. Decode steps are not split: their matmuls read the whole weight matrices, so two halves
// would read them twice.
//
// CUDA graphs: the layers of a call of n rows, n <= graph_max_rows (the decode steps of a micro-batch), are
// captured into a graph the second time n is seen (the first call runs eagerly, so libraries finish their
// lazy set-up outside the capture) and replayed from then on: positions, block tables and context lengths
// are read on the device, so one graph serves every step. If the driver refuses a capture (ResourceError),
// the stage says so once and launches eagerly from then on; an NCCL that refuses to be captured fails the
// job with a CommError that names --cuda-graphs off (docs/cuda.md).
#pragma once

#include <memory>
#include <string>

#include "kernels/cpu/weight_format.h"
#include "partition/mesh.h"
#include "partition/model_shape.h"
#include "partition/shard.h"
#include "runtime/stage.h"
#include "runtime/stage_backend.h"

namespace shardline::runtime {

class LoadWatch;  // runtime/load_watch.h

struct CudaStageOptions {
  StageOptions stage;  // rows, eps, theta, KV block size and count (arena and numa_node unused)
  int device = 0;      // this rank's CUDA device
  kernels::cpu::WeightDtype weights_dtype = kernels::cpu::WeightDtype::kF32;  // fp32 or bf16; int8: ConfigError
  double comm_timeout_s = 120.0;  // the NCCL TP group's bound on waiting for a peer
  bool graphs = true;             // capture decode steps in CUDA graphs (--cuda-graphs)
  int graph_max_rows = 64;        // calls of more rows always launch eagerly (prefill chunks)
  int overlap_min_rows = 64;      // tp > 1: calls of at least this many rows overlap all-reduces with compute
  LoadWatch* load_watch = nullptr;  // armed while the weights upload, told of each tensor (construction only)
};

// Collective over the MPI world when tp > 1 (the NCCL TP groups are made here): every rank of the job
// calls it at the same point. ResourceError without a usable device.
std::unique_ptr<StageBackend> make_cuda_stage(const std::string& model_path, const partition::ModelShape& shape,
                                              const partition::RankShard& shard, const partition::Mesh& mesh,
                                              const CudaStageOptions& options);

}  // namespace shardline::runtime
