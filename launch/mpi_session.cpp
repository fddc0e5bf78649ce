#include "launch/mpi_session.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "comm/liveness.h"
#include "comm/poller.h"
#include "common/error.h"

namespace shardline::launch {

namespace {

void mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Waits for a non-blocking start-up collective, at most timeout_s (comm/poller.h: spin, yield, then sleep
// 1 ms between polls: start-up is not latency-bound, and a rank still loading may share this core). A
// timeout ends the job at once, with its reason: unwinding would leave the request pending (its buffers on
// a stack that is gone, and MPI_Finalize waiting on it), and the stuck rank may never arrive.
void wait_bounded(MPI_Request& request, double timeout_s, const char* what, int abort_code) {
  comm::Poller poller(timeout_s, 1'000'000);
  for (;;) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      throw CommError(fmt::format("MPI failed while the ranks {}", what));
    }
    if (done != 0) return;
    if (poller.spun_out()) comm::answer_pings();
    if (!poller.pause()) {
      const std::string silent = comm::silent_ranks_note();
      print_error_line(fmt::format("a rank did not arrive within {:g} s (--comm-timeout) while the ranks {}{}", timeout_s,
                                   what,
                                   silent.empty() ? ": is one stuck (reading its files from a hung file system, "
                                                    "stopped, or swapping)?"
                                                  : silent));
      MPI_Abort(MPI_COMM_WORLD, abort_code);
      std::_Exit(abort_code);  // MPI_Abort does not return; should it, nothing may unwind past the request
    }
  }
}

// Ends the task if MPI's start-up has not finished within timeout_s: Open MPI's MPI_Init waits (a PMIx fence) for
// every task of the job, so one task stopped or stuck before it (a hung file system, a debugger) held all the
// others there until the job's time limit. Nothing can be unwound from inside MPI_Init: the task leaves with
// one line and exit 5, and the launcher ends the rest of the job.
class InitWatchdog {
 public:
  InitWatchdog(double timeout_s, int task) {
    if (!(timeout_s < comm::kNeverTimeoutS)) return;  // inf: no bound, as every other wait (comm/poller.h)
    thread_ = std::thread([this, timeout_s, task] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (done_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return disarmed_; })) return;
      std::fprintf(stderr,
                   "[r%d] error: MPI start-up (MPI_Init and its first collectives) did not complete within %g s "
                   "(--comm-timeout): a task of "
                   "this job has not reached it (stopped, stuck before it on a hung file system, or never "
                   "started)\n",
                   task, timeout_s);
      std::fflush(stderr);
      std::_Exit(static_cast<int>(ExitCode::kComm));
    });
  }
  ~InitWatchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      disarmed_ = true;
    }
    done_.notify_one();
    thread_.join();
  }
  InitWatchdog(const InitWatchdog&) = delete;
  InitWatchdog& operator=(const InitWatchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool disarmed_ = false;
  std::thread thread_;
};

}  // namespace

MpiSession::MpiSession(double init_timeout_s) : launch_env_(detect_launch_env()), node_name_(host_name()) {
  if (launch_env_.srun_without_pmix()) {
    // Every task would be its own one-rank job; one task says so, the others leave with the same code.
    if (launch_env_.task_rank() > 0) std::exit(static_cast<int>(ExitCode::kConfig));
    throw ConfigError(fmt::format("srun started {} tasks without PMIx, so they cannot find each other: launch "
                                  "with 'srun --mpi=pmix' (Debian's Open MPI speaks PMIx only, not pmi2)",
                                  launch_env_.slurm->n_tasks));
  }
  if (launch_env_.pmi_tasks_without_pmix()) {
    // The same for MPICH's or Intel MPI's mpiexec (Hydra): it wires its tasks over PMI, which Open MPI does
    // not speak, so MPI_Init would make each one a job of one rank that generates alone.
    if (launch_env_.task_rank() > 0) std::exit(static_cast<int>(ExitCode::kConfig));
    const int n = launch_env_.pmi->size;
    throw ConfigError(fmt::format("started as {} tasks by a PMI launcher (PMI_SIZE={}: e.g. MPICH's or Intel MPI's "
                                  "mpiexec, Hydra), which this shardline's Open MPI cannot join (it speaks "
                                  "PMIx only), so every task would run alone: launch with Open MPI's mpirun "
                                  "('mpirun -np {} shardline ...'), or 'srun --mpi=pmix' under Slurm",
                                  n, n, n));
  }
  if (!launch_env_.wired_by_launcher()) return;
  launcher_ = launcher_name(launch_env_.launcher);
  int provided = 0;
  // Until the last blocking collective below (MPI_Comm_dup, MPI_Comm_split_type) has returned.
  std::optional<InitWatchdog> watchdog(std::in_place, init_timeout_s, std::max(0, launch_env_.task_rank()));
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    throw CommError("MPI_Init_thread failed");
  }
  active_ = true;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  // Errors come back as codes and become exceptions (then a job-wide abort), not MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  set_abort_hook(&mpi_abort);
  comm::start_liveness();  // a timeout can then name the rank that is stuck (comm/liveness.h)
  // Node identity from MPI, not from the launcher's variables: it holds for every launcher.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  if (MPI_Get_processor_name(name, &length) == MPI_SUCCESS) node_name_.assign(name, length);
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
  }
  watchdog.reset();
}

MpiSession::~MpiSession() {
  if (active_) {
    set_abort_hook(nullptr);
    comm::stop_liveness();
    MPI_Finalize();
  }
}

MpiSession::Agreement MpiSession::agree(int local_exit_code, double timeout_s) const {
  if (!active_ || world_size_ == 1) return {local_exit_code, local_exit_code != 0 ? world_rank_ : -1};
  int values[2] = {local_exit_code, local_exit_code != 0 ? -world_rank_ : -world_size_};  // max of -rank = min rank
  int reduced[2] = {0, 0};
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Iallreduce(values, reduced, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &request) != MPI_SUCCESS) {
    throw CommError("MPI_Iallreduce failed while the ranks compared their start-up checks");
  }
  wait_bounded(request, timeout_s, "compared their start-up checks", static_cast<int>(ExitCode::kComm));
  return {reduced[0], reduced[0] != 0 ? -reduced[1] : -1};
}

int MpiSession::report_failure(const Agreement& agreement, const std::string& message, double timeout_s) const {
  const bool printer = agreement.first_failed_rank == world_rank_;
  if (printer) print_error_line(message);
  if (active_ && world_size_ > 1) {
    // Nobody exits before the printing rank's line is written (stderr is unbuffered). A barrier that fails
    // changes nothing: the job fails either way, with its code.
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &request) == MPI_SUCCESS) {
      wait_bounded(request, timeout_s, "waited for the failure's reason to be printed", agreement.exit_code);
    }
  }
  return agreement.exit_code;
}

std::string MpiSession::rank0_bytes(const std::string& mine, double timeout_s) const {
  if (!active_ || world_size_ == 1) return mine;
  constexpr const char* kWhat = "compared their configurations";
  std::uint64_t size = mine.size();
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &request) != MPI_SUCCESS) {
    throw CommError(fmt::format("MPI_Ibcast failed while the ranks {}", kWhat));
  }
  wait_bounded(request, timeout_s, kWhat, static_cast<int>(ExitCode::kComm));
  if (size > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    throw CommError(fmt::format("rank 0's configuration of {} bytes is more than one broadcast carries", size));
  }
  std::string bytes = world_rank_ == 0 ? mine : std::string(size, '\0');
  if (size == 0) return bytes;
  if (MPI_Ibcast(bytes.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD, &request) != MPI_SUCCESS) {
    throw CommError(fmt::format("MPI_Ibcast failed while the ranks {}", kWhat));
  }
  wait_bounded(request, timeout_s, kWhat, static_cast<int>(ExitCode::kComm));
  return bytes;
}

MpiSession::Spread MpiSession::spread(std::optional<std::uint64_t> value, double timeout_s) const {
  if (!active_ || world_size_ == 1) return value ? Spread{1, *value, *value} : Spread{};
  // One minimum over {1 - given, value, ~value}: the count from how many gave none, the highest as the
  // complement of the lowest complement. Ranks without a value send the identity of each.
  constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t mine[2] = {value ? *value : kNone, value ? ~*value : kNone};
  std::uint64_t least[2] = {0, 0};
  int given = value ? 1 : 0, count = 0;
  constexpr const char* kWhat = "compared their configurations";
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  if (MPI_Iallreduce(mine, least, 2, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD, &requests[0]) != MPI_SUCCESS ||
      MPI_Iallreduce(&given, &count, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &requests[1]) != MPI_SUCCESS) {
    throw CommError(fmt::format("MPI_Iallreduce failed while the ranks {}", kWhat));
  }
  wait_bounded(requests[0], timeout_s, kWhat, static_cast<int>(ExitCode::kComm));
  wait_bounded(requests[1], timeout_s, kWhat, static_cast<int>(ExitCode::kComm));
  return {count, least[0], ~least[1]};
}

void MpiSession::abort_job(int exit_code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  if (active_ && world_size_ > 1) {
    comm::linger_after_asking();  // the others' probes finish before the abort wakes a stopped rank
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  if (active_) {
    comm::stop_liveness();  // its receive must not be pending in MPI_Finalize
    MPI_Finalize();
  }
  std::exit(exit_code);
}

}  // namespace shardline::launch
