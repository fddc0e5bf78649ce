#include "partition/mesh.h"

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::partition {

Mesh::Mesh(int world_size, int rank, int tp_size, int pp_size)
    : world_size_(world_size), rank_(rank), tp_size_(tp_size), pp_size_(pp_size) {
  if (world_size < 1) throw ConfigError(fmt::format("world size must be >= 1, got {}", world_size));
  if (tp_size < 1 || pp_size < 1) {
    throw ConfigError(fmt::format("tp and pp must be >= 1, got tp={} pp={}", tp_size, pp_size));
  }
  if (tp_size * pp_size != world_size) {
    throw ConfigError(fmt::format("tp={} x pp={} = {} ranks, but the job has {} ranks; launch with -np {} or "
                                  "change --tp/--pp",
                                  tp_size, pp_size, tp_size * pp_size, world_size, tp_size * pp_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw ConfigError(fmt::format("rank {} is outside a world of {} ranks", rank, world_size));
  }
}

std::vector<int> Mesh::tp_group() const {
  std::vector<int> ranks;
  for (int t = 0; t < tp_size_; ++t) ranks.push_back(rank_of(pp_rank(), t));
  return ranks;
}

int Mesh::next_stage_rank() const { return is_last_stage() ? -1 : rank_of(pp_rank() + 1, tp_rank()); }
int Mesh::prev_stage_rank() const { return is_first_stage() ? -1 : rank_of(pp_rank() - 1, tp_rank()); }

std::string Mesh::tag() const {
  if (world_size_ == 1) return "[r0]";
  return fmt::format("[r{} pp{} tp{}]", rank_, pp_rank(), tp_rank());
}

}  // namespace shardline::partition
