// The launch preflight: does this layout fit what the launcher is about to start? Checked on the
// submitting or launching host before mpirun/srun starts a single rank, because once they do, a bad
// hostfile or a too-small allocation surfaces as mpirun's or srun's own multi-line error (or as idle
// ranks) instead of one line that says what to change.
//
// Rules (tp x pp = the ranks the layout uses, one shard each):
//   --np N (what mpirun -np / srun -n starts)    must equal tp x pp           else ConfigError (exit 2)
//   Slurm allocation: SLURM_NTASKS               below tp x pp                -> ResourceError (exit 4)
//                                                above it (without --np)      -> ConfigError: srun starts one rank per task
//   hostfile: sum of slots (max_slots with --oversubscribe), when every host gives slots=, at least tp x pp
//                                                                              else ResourceError (exit 4)
//   rankfile: exactly ranks 0 .. tp x pp - 1, on hosts of the hostfile        else ConfigError (exit 2)
// A TP group split over two hosts is legal but slow (two all-reduces per layer cross the network): a warning.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launch/hostfile.h"
#include "launch/launch_env.h"

namespace shardline::launch {

struct LaunchRequest {
  int tp_size = 1;
  int pp_size = 1;
  std::optional<int> n_ranks;             // --np: ranks the launcher will start; nullopt: not given
  std::optional<Hostfile> hostfile;
  std::vector<RankfileEntry> rankfile;    // empty: no rankfile
  bool oversubscribe = false;
  std::optional<SlurmAllocation> slurm;   // the allocation this runs in, if any
};

struct LaunchCheckReport {
  int n_ranks = 0;
  // Host of each rank when it can be known here (rankfile; hostfile filled in order, as mpirun fills
  // each host's slots before the next; Slurm's block distribution as "node I"); else empty.
  std::vector<std::string> rank_hosts;
  std::vector<std::string> warnings;
  // "tp=2 x pp=2 = 4 ranks: node01 ranks 0-1, node02 ranks 2-3"
  std::string summary(int tp_size, int pp_size) const;
};

// Throws ConfigError / ResourceError (see the rules above) with one line that says what to change.
LaunchCheckReport check_launch(const LaunchRequest& request);

}  // namespace shardline::launch
