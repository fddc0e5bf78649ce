#include "runtime/stage_backend.h"

#include "common/error.h"

namespace shardline::runtime {

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
