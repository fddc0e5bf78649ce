// Where a rank sits in the job: one small, copyable, comparable value.
//
// TP is innermost so TP peers are neighbours in rank order (and usually share a host):
//   tp_rank = rank % tp_size,  pp_rank = rank / tp_size.
// Example, 8 ranks at tp=2, pp=4:
//   stage 0: ranks {0,1}   stage 1: {2,3}   stage 2: {4,5}   stage 3: {6,7}
//   TP groups: {0,1} {2,3} {4,5} {6,7};  PP chains (same tp_rank): {0,2,4,6} {1,3,5,7}
#pragma once

#include <string>
#include <vector>

namespace shardline::partition {

class Mesh {
 public:
  // Throws ConfigError when the grid does not fit the world (tp*pp != world_size, rank out of range...).
  Mesh(int world_size, int rank, int tp_size, int pp_size);
  static Mesh single() { return Mesh(1, 0, 1, 1); }

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int tp_size() const { return tp_size_; }
  int pp_size() const { return pp_size_; }
  int tp_rank() const { return rank_ % tp_size_; }
  int pp_rank() const { return rank_ / tp_size_; }

  bool is_first_stage() const { return pp_rank() == 0; }
  bool is_last_stage() const { return pp_rank() == pp_size_ - 1; }

  // World ranks of this rank's TP group, in tp_rank order.
  std::vector<int> tp_group() const;
  // World rank holding (pp_rank, tp_rank).
  int rank_of(int pp_rank, int tp_rank) const { return pp_rank * tp_size_ + tp_rank; }
  // Same tp_rank in the next / previous stage; -1 at the ends of the pipeline.
  int next_stage_rank() const;
  int prev_stage_rank() const;

  // Log prefix: "[r3 pp1 tp1]", or "[r0]" for a single rank.
  std::string tag() const;

  bool operator==(const Mesh&) const = default;

 private:
  int world_size_;
  int rank_;
  int tp_size_;
  int pp_size_;
};

}  // namespace shardline::partition
