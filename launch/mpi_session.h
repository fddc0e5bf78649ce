// The MPI init/finalize scope. MPI is initialised only when a launcher started us (mpirun, srun with
// PMIx): a plain `shardline run` is a one-rank job without any MPI machinery.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "common/error.h"
#include "launch/launch_env.h"

namespace shardline::launch {

// --comm-timeout's default: seconds a rank waits for a peer before failing the job.
inline constexpr double kDefaultCommTimeoutS = 120.0;
// Its least value: below a second MPI's own start-up outlasted it, and every task timed out alone, each
// with its own line.
inline constexpr double kMinCommTimeoutS = 1.0;

class MpiSession {
 public:
  // Initialises MPI if launched by mpirun/srun; installs MPI_Abort as the abort hook. Throws ConfigError
  // for srun steps of several tasks without PMIx (they would run as unrelated one-rank jobs). MPI_Init waits
  // for every task of the job: one that does not get there within init_timeout_s (--comm-timeout) ends this
  // task with one line and exit 5, rather than holding it until the job's time limit.
  explicit MpiSession(double init_timeout_s = kDefaultCommTimeoutS);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  bool active() const { return active_; }
  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  // "mpirun", "srun", or "plain process": for --verbose and messages.
  const std::string& launcher() const { return launcher_; }
  // What the launcher's variables say (hints; the values below come from MPI itself).
  const LaunchEnv& launch_env() const { return launch_env_; }
  // This rank's node as MPI names it, and its place among the ranks sharing that node's memory
  // (MPI_COMM_TYPE_SHARED). A plain process: the host name, 0 of 1.
  const std::string& node_name() const { return node_name_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // Every rank reports its own outcome of a phase (0 = ok, else an exit code); all ranks learn the worst
  // code and the lowest rank that failed, so exactly one rank prints the reason and all exit together.
  struct Agreement {
    int exit_code = 0;
    int first_failed_rank = -1;
  };
  // timeout_s bounds the wait for the other ranks (--comm-timeout; comm/poller.h's policy): a rank stuck
  // before it (a hung file system, a stopped process) ends the job (MPI_Abort, exit 5, one line naming the
  // timeout) instead of hanging it.
  Agreement agree(int local_exit_code, double timeout_s) const;
  // Prints a failed agreement's reason on the rank that must (the lowest that failed; `message` is this
  // rank's own) and returns the agreed exit code. No rank returns before that line is written (a barrier):
  // mpirun ends the job when a rank exits non-zero and kills the others, and a printing rank killed before
  // its line was out (a loaded machine, a slow rank) took the reason with it.
  int report_failure(const Agreement& agreement, const std::string& message, double timeout_s) const;
  // Collective: rank 0's bytes on every rank (`mine` where there are no others). For what every rank must
  // share (launch/agreed_fields.h).
  std::string rank0_bytes(const std::string& mine, double timeout_s) const;
  // Collective: on how many ranks `value` is given, and the lowest and highest of the values given (alone or
  // without MPI: this rank's). E.g. whether every rank that found a difference found the same one.
  struct Spread {
    int count = 0;
    std::uint64_t lowest = 0;
    std::uint64_t highest = 0;
  };
  Spread spread(std::optional<std::uint64_t> value, double timeout_s) const;

  // Ends the whole job with this exit code (MPI_Abort when active), so no peer waits forever.
  [[noreturn]] void abort_job(int exit_code) const;

 private:
  bool active_ = false;
  int world_size_ = 1;
  int world_rank_ = 0;
  std::string launcher_ = "plain process";
  LaunchEnv launch_env_;
  std::string node_name_;
  int local_rank_ = 0;
  int local_size_ = 1;
};

// Runs a start-up phase on every rank and makes the ranks agree on its outcome: exactly one rank (the
// lowest that failed) prints the reason, and every rank returns the same exit code, so nobody is left
// waiting in a collective. Returns 0 when every rank succeeded.
// timeout_s: --comm-timeout once the flags are read (a reference, so a phase that reads them sets it).
template <typename Phase>
int agreed_phase(const MpiSession& mpi, const double& timeout_s, Phase&& phase) {
  int local = 0;
  std::string message;
  try {
    phase();
  } catch (const CommError& e) {
    // A peer that failed or hung in this phase's own collectives (the planner's probe, the host split)
    // would not reach the agreement either, which would only wait a second --comm-timeout: end the job.
    print_error_line(e.what());
    mpi.abort_job(static_cast<int>(e.code()));
  } catch (const std::exception& e) {
    const Failure failure = failure_of(e);
    local = static_cast<int>(failure.code);
    message = failure.message;
  }
  const MpiSession::Agreement agreement = mpi.agree(local, timeout_s);
  return agreement.exit_code != 0 ? mpi.report_failure(agreement, message, timeout_s) : 0;
}

}  // namespace shardline::launch
