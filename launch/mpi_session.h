// The MPI init/finalize scope. MPI is initialised only when a launcher started us (mpirun, srun with
// PMIx): a plain `shardline run` is a one-rank job without any MPI machinery.
#pragma once

#include <string>

namespace shardline::launch {

class MpiSession {
 public:
  MpiSession();  // initialises MPI if launched by mpirun/srun; installs MPI_Abort as the abort hook
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  bool active() const { return active_; }
  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  // "mpirun", "srun", or "plain process": for --verbose and messages.
  const std::string& launcher() const { return launcher_; }

  // Every rank reports its own outcome of a phase (0 = ok, else an exit code); all ranks learn the worst
  // code and the lowest rank that failed, so exactly one rank prints the reason and all exit together.
  struct Agreement {
    int exit_code = 0;
    int first_failed_rank = -1;
  };
  Agreement agree(int local_exit_code) const;

  // Ends the whole job with this exit code (MPI_Abort when active), so no peer waits forever.
  [[noreturn]] void abort_job(int exit_code) const;

 private:
  bool active_ = false;
  int world_size_ = 1;
  int world_rank_ = 0;
  std::string launcher_ = "plain process";
};

}  // namespace shardline::launch
