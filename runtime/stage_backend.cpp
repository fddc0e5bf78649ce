#include "runtime/stage_backend.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/ops.h"

namespace shardline::runtime {

void StageBackend::greedy_tokens(const float* x, int n, float* logits_scratch, int* tokens, float* values,
                                 bool* saw_nan) {
  logits(x, n, logits_scratch);
  const int vocab = shape().vocab_size;
  kernels::cpu::parallel_for(n, [&](int r, int) {
    const float* row = logits_scratch + static_cast<std::size_t>(r) * vocab;
    tokens[r] = kernels::cpu::argmax(row, vocab);
    values[r] = row[tokens[r]];
    saw_nan[r] = std::any_of(row, row + vocab, [](float v) { return std::isnan(v); });
  });
}

// Reached only by a pipeline bug: the pipeline calls these only when moves_activations() says so.
void StageBackend::recv_activations(int) { SL_CHECK_MSG(false, "{} does not move activations", describe()); }
void StageBackend::forward_resident(const float*, const Row*, int) {
  SL_CHECK_MSG(false, "{} does not move activations", describe());
}
std::unique_ptr<comm::PendingSend> StageBackend::isend_activations(int) {
  SL_CHECK_MSG(false, "{} does not move activations", describe());
  return nullptr;
}
void StageBackend::download_activations(float*, int) {
  SL_CHECK_MSG(false, "{} does not move activations", describe());
}

}  // namespace shardline::runtime
