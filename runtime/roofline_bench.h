// Decode and prefill throughput of a loaded Engine, each as a fraction of a bandwidth roofline measured in
// the same run: what `shardline bench` reports (launch/bench_command.cpp prints it).
//
// The roofline. A decode step streams every weight byte of every rank once, plus each sequence's KV cache,
// so it cannot be faster than the bandwidth probe (kernels/cpu/bandwidth_probe.h) streaming those same
// rank-local buffers with the same threads (the best of three sweeps). The probe runs on all TP ranks of a
// stage at once (they share the memory system in decode too) and stage after stage (a batch of sequences in
// one micro-batch visits the stages one after another), right before every measured run.
//   step_s(B)        = sum over stages of max over the stage's ranks of  probe_s * (weights + B * kv) / weights
//   decode roofline  = B / step_s(B) tokens per second (kv: the KV bytes one sequence reads per step, at the
//                      run's mean position)
//   prefill roofline = P / (ceil(P / chunk) * step_s(0)): far above what the arithmetic allows, so prefill
//                      fractions are small by nature; GFLOP/s says how close it is to the compute limit.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "runtime/engine.h"

namespace shardline::runtime {

struct RooflineBenchOptions {
  std::vector<int> batches = {1, 4, 16};  // sequences decoding together (one micro-batch)
  int decode_prompt_tokens = 8;           // per sequence, BOS first
  int decode_steps = 32;                  // tokens generated per sequence
  int prefill_tokens = 128;               // one prompt, in the engine's prefill chunks
  int repeats = 3;                        // runs per number (the batch sizes' runs take turns)
  // How the runs become one number. kMedian: the typical run. kBest: the fastest run and the highest
  // roofline (each from its own run), for a shared machine where a neighbour can only slow a run down.
  enum class Statistic { kMedian, kBest } statistic = Statistic::kMedian;
};

struct ThroughputMeasurement {
  int rows = 0;               // decode: the batch; prefill: the prompt tokens
  double tok_s = 0;           // decode: aggregate over the batch
  double roofline_tok_s = 0;  // from the probe run right before it
  double gflops = 0;          // matmul and attention arithmetic per second
  double fraction() const { return roofline_tok_s > 0 ? tok_s / roofline_tok_s : 0; }
};

struct RooflineBenchResult {
  std::uint64_t weight_bytes = 0;  // streamed per forward pass, all ranks together
  double read_gbps = 0;            // weight_bytes / the probe's step time: the bandwidth the roofline assumes
  std::vector<ThroughputMeasurement> decode;  // one per batch size
  ThroughputMeasurement prefill;
};

// Every rank of the job calls it with the same options; the result is complete on the output rank
// (engine.is_output_rank()). world: every rank of the job.
RooflineBenchResult run_roofline_bench(Engine& engine, comm::Communicator& world, const RooflineBenchOptions& options);

}  // namespace shardline::runtime
