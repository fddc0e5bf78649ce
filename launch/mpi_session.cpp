#include "launch/mpi_session.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace shardline::launch {

namespace {

void mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

bool has_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0';
}

}  // namespace

MpiSession::MpiSession() {
  // Open MPI's mpirun sets OMPI_COMM_WORLD_*; srun --mpi=pmix and other PMIx launchers set PMIX_RANK.
  if (has_env("OMPI_COMM_WORLD_SIZE")) {
    launcher_ = "mpirun";
  } else if (has_env("PMIX_RANK")) {
    launcher_ = has_env("SLURM_JOB_ID") ? "srun" : "pmix";
  } else {
    return;
  }
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    throw CommError("MPI_Init_thread failed");
  }
  active_ = true;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  // Errors come back as codes and become exceptions (then a job-wide abort), not MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  set_abort_hook(&mpi_abort);
}

MpiSession::~MpiSession() {
  if (active_) {
    set_abort_hook(nullptr);
    MPI_Finalize();
  }
}

MpiSession::Agreement MpiSession::agree(int local_exit_code) const {
  if (!active_ || world_size_ == 1) return {local_exit_code, local_exit_code != 0 ? world_rank_ : -1};
  int values[2] = {local_exit_code, local_exit_code != 0 ? -world_rank_ : -world_size_};  // max of -rank = min rank
  int reduced[2] = {0, 0};
  if (MPI_Allreduce(values, reduced, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) {
    throw CommError("MPI_Allreduce failed while the ranks compared their start-up checks");
  }
  return {reduced[0], reduced[0] != 0 ? -reduced[1] : -1};
}

void MpiSession::abort_job(int exit_code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  if (active_ && world_size_ > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
  if (active_) MPI_Finalize();
  std::exit(exit_code);
}

}  // namespace shardline::launch
