// Random-weight llama2.c checkpoints of any shape, with a matching synthetic tokenizer: for tests,
// benchmarks and the built-in default model. Deterministic for a given (shape, seed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "partition/model_shape.h"

namespace shardline::runtime {

struct GeneratedModelPaths {
  std::string model;
  std::string tokenizer;
};

// Called with (bytes written, total bytes) as the checkpoint is written.
using ProgressCallback = std::function<void(std::uint64_t, std::uint64_t)>;

// Writes the checkpoint to model_path and the tokenizer to tokenizer_path, each through a temporary file
// renamed into place, so a reader never sees half a file and concurrent writers cannot corrupt it.
// Weights: uniform with std gain/sqrt(fan_in) (unit-scale activations, clear logit margins); norms 1.
// What generate_model checks before writing a byte (a caller may ask first, to fail before saying it
// writes): a valid shape (ConfigError), both files' folders existing as folders and the model's with room
// for it (ResourceError); part files left by writers that died are removed first.
void prepare_model_destinations(const partition::ModelShape& shape, const GeneratedModelPaths& paths);

void generate_model(const partition::ModelShape& shape, std::uint64_t seed, const GeneratedModelPaths& paths,
                    const ProgressCallback& progress = {});

// "<out minus .bin>.tokenizer.bin": where gen-model puts the tokenizer when not told.
std::string default_tokenizer_path_for(const std::string& model_path);

// Shardline's cache folder ($SHARDLINE_CACHE_DIR, else $XDG_CACHE_HOME/shardline, else ~/.cache/shardline),
// created if missing; ResourceError if it cannot be.
std::string cache_dir();

// A generated model of this shape and seed at <dir>/<name>.bin (with its tokenizer beside it), written
// only when missing, so benchmarks and the default model are generated once and reused. `what` names it
// in the log line said while generating ("the built-in default model").
GeneratedModelPaths ensure_generated_model(const partition::ModelShape& shape, std::uint64_t seed,
                                           const std::string& dir, const std::string& name, const std::string& what);

// The built-in default model (the 15m preset shape with an unshared classifier, seed 42), generated once into the cache folder
// ($SHARDLINE_CACHE_DIR, else $XDG_CACHE_HOME/shardline, else ~/.cache/shardline) and reused.
GeneratedModelPaths ensure_default_model();

}  // namespace shardline::runtime
