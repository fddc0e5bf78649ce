// One rank's weights: zero-copy read-only mappings of the row slices it owns, and rank-local copies of the
// column slices (wo, w2 under TP), which are strided in the file. Nothing else of the checkpoint is mapped,
// so resident memory scales with the shard.
// Placement: the mapped ranges are populated up front and bound to the rank's NUMA node; the copies live
// in the rank's arena (hugepages when it has them). With copy_to_arena every slice is read into the arena
// instead of mapped (no page cache sharing, but the arena's page size for all weights).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/arena.h"
#include "memory/mapped_file.h"
#include "partition/model_shape.h"
#include "partition/shard.h"

namespace shardline::runtime {

// Shapes use the rank-local sizes: q_dim = local heads * head_size, kv_dim = local kv heads * head_size,
// hidden = local hidden features.
struct LayerWeights {
  const float* rms_att = nullptr;  // (dim)
  const float* wq = nullptr;       // (q_dim, dim)
  const float* wk = nullptr;       // (kv_dim, dim)
  const float* wv = nullptr;       // (kv_dim, dim)
  const float* wo = nullptr;       // (dim, q_dim)
  const float* rms_ffn = nullptr;  // (dim)
  const float* w1 = nullptr;       // (hidden, dim)
  const float* w2 = nullptr;       // (dim, hidden)
  const float* w3 = nullptr;       // (hidden, dim)
};

struct WeightPlacement {
  memory::Arena* arena = nullptr;  // repacked slices live here (it must outlive the weights); nullptr: own arena
  int numa_node = -1;              // bind the mapped ranges to this node; -1: unbound
  bool copy_to_arena = false;      // read every slice into the arena instead of mapping it
};

class ShardWeights {
 public:
  // Validates the file against `shape` first (size, header); throws FormatError / ResourceError.
  ShardWeights(const std::string& path, const partition::ModelShape& shape, const partition::RankShard& shard,
               const WeightPlacement& placement = {});

  // Arena bytes this shard's weights take (repacked slices, or every slice with copy_to_arena), alignment
  // included: for sizing the arena before loading.
  static std::uint64_t arena_bytes_needed(const partition::ModelShape& shape, const partition::RankShard& shard,
                                          bool copy_to_arena);

  const partition::ModelShape& shape() const { return shape_; }
  const partition::RankShard& shard() const { return shard_; }

  const float* token_embedding() const { return token_embedding_; }  // (vocab, dim); first stage only
  const LayerWeights& layer(int local_index) const { return layers_[local_index]; }
  int n_local_layers() const { return static_cast<int>(layers_.size()); }
  const float* rms_final() const { return rms_final_; }    // (dim); last stage only
  const float* classifier() const { return classifier_; }  // (vocab slice, dim); last stage only

  std::uint64_t mapped_bytes() const { return mapped_bytes_; }
  std::uint64_t repacked_bytes() const { return repacked_bytes_; }
  std::uint64_t copied_bytes() const { return copied_bytes_; }  // read into the arena (copy_to_arena)

 private:
  const float* map_floats(std::uint64_t offset_bytes, std::uint64_t n_floats, bool populate);
  const float* repack_columns(std::uint64_t matrix_offset_bytes, int rows, int cols, partition::Range columns);

  partition::ModelShape shape_;
  partition::RankShard shard_;
  memory::MappedFile file_;
  std::vector<memory::MappedRegion> regions_;
  WeightPlacement placement_;
  std::unique_ptr<memory::Arena> own_arena_;  // only when placement.arena was null
  std::vector<LayerWeights> layers_;
  const float* token_embedding_ = nullptr;
  const float* rms_final_ = nullptr;
  const float* classifier_ = nullptr;
  std::uint64_t mapped_bytes_ = 0;
  std::uint64_t repacked_bytes_ = 0;
  std::uint64_t copied_bytes_ = 0;
};

}  // namespace shardline::runtime
