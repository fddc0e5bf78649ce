// Which ranks of the job still answer, so that a timed-out wait can name the rank that is stuck.
//
// Why: a rank whose wait times out knows only the peer it waited for, and that peer is often waiting in turn
// for a third rank (in a pipeline, every stage waits on the one before): with one rank stopped, the first
// error line named a healthy neighbour, and a collective's timeout named nobody.
//
// How: every rank keeps a receive posted for pings on its own duplicate of MPI_COMM_WORLD, and every wait in
// comm/ (and the start-up agreement's) answers them while it waits, once past its first microseconds of
// spinning. A rank whose wait times out pings every other rank and gives them a short grace to answer: a rank
// that does not is stopped, stuck outside any wait (a hung file system, an endless loop), or dead. Ranks busy
// computing answer at their next wait, which a decode step reaches within milliseconds.
#pragma once

#include <string>
#include <vector>

namespace shardline::comm {

// Collective over MPI_COMM_WORLD, right after MPI_Init (launch/mpi_session.cpp); stop before MPI_Finalize.
// Without it (a plain process, tests) the functions below do nothing and name nobody.
void start_liveness();
void stop_liveness();

// Answers the pings that arrived (a few MPI_Test calls): from every wait loop.
void answer_pings();

// The world ranks, other than this one, that did not answer a ping within grace_s (answering others' pings
// meanwhile, as their waits may be timing out too). Empty when liveness is not started.
std::vector<int> silent_ranks(double grace_s);

// For a timeout's message, after what the wait waited for: "; rank 3 does not answer within 2 s (stopped,
// stuck outside MPI, or dead), every other rank does", or "; every rank answers (they all wait: a deadlock,
// or a rank far behind)", or "" when liveness is not started.
inline constexpr double kLivenessGraceS = 2.0;
std::string silent_ranks_note(double grace_s = kLivenessGraceS);
// A communicator's timeout message's end: silent_ranks_note(), or ": a peer is stuck or dead" when liveness
// is not started (one job-wide wording for the MPI, shared-memory and NCCL waits).
std::string timeout_cause_note();

// After this rank asked (silent_ranks), answers pings for seconds before the caller ends the job: the job's
// end sends SIGCONT to every rank, so a rank stopped by SIGSTOP woke up and answered the probes of the ranks
// that timed out a moment later, which then said "every rank answers". Returns at once if it did not ask.
void linger_after_asking(double seconds = 2 * kLivenessGraceS);

}  // namespace shardline::comm
