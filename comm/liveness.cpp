#include "comm/liveness.h"

#include <mpi.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace shardline::comm {
namespace {

constexpr int kPingTag = 1;
constexpr int kAnswerTag = 2;

// One rank's side of the probe. Only the thread that calls MPI (MPI_THREAD_FUNNELED) touches it.
struct Liveness {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int ping = 0;                                    // the posted receive's buffer
  MPI_Request ping_request = MPI_REQUEST_NULL;
  static constexpr int kAnswer = 1;                // what an answer carries (its arrival is the message)
  std::vector<MPI_Request> answers_sent;           // completed at the next answer_pings()
  bool asked = false;                              // silent_ranks() ran on this rank
};

Liveness& state() {
  static Liveness liveness;
  return liveness;
}

void post_ping_receive(Liveness& l) {
  MPI_Irecv(&l.ping, 1, MPI_INT, MPI_ANY_SOURCE, kPingTag, l.comm, &l.ping_request);
}

}  // namespace

void start_liveness() {
  Liveness& l = state();
  if (l.comm != MPI_COMM_NULL) return;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &l.comm) != MPI_SUCCESS) {
    l.comm = MPI_COMM_NULL;  // the job runs without it; timeouts then name only the peer they waited for
    return;
  }
  MPI_Comm_set_errhandler(l.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(l.comm, &l.rank);
  MPI_Comm_size(l.comm, &l.size);
  post_ping_receive(l);
}

void stop_liveness() {
  Liveness& l = state();
  if (l.comm == MPI_COMM_NULL) return;
  MPI_Cancel(&l.ping_request);
  MPI_Wait(&l.ping_request, MPI_STATUS_IGNORE);
  for (MPI_Request& sent : l.answers_sent) MPI_Wait(&sent, MPI_STATUS_IGNORE);
  l.answers_sent.clear();
  MPI_Comm_free(&l.comm);
}

void answer_pings() {
  Liveness& l = state();
  if (l.comm == MPI_COMM_NULL) return;
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Test(&l.ping_request, &arrived, &status) != MPI_SUCCESS || arrived == 0) break;
    MPI_Request sent = MPI_REQUEST_NULL;
    if (MPI_Isend(&Liveness::kAnswer, 1, MPI_INT, status.MPI_SOURCE, kAnswerTag, l.comm, &sent) == MPI_SUCCESS) {
      l.answers_sent.push_back(sent);
    }
    post_ping_receive(l);
  }
  // Answers are one int each: they complete at once, and are let go of here.
  std::erase_if(l.answers_sent, [](MPI_Request& sent) {
    int done = 0;
    MPI_Test(&sent, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

std::vector<int> silent_ranks(double grace_s) {
  Liveness& l = state();
  if (l.comm == MPI_COMM_NULL) return {};
  l.asked = true;
  std::vector<MPI_Request> pings, answers;
  std::vector<int> peers, answer_buffers(static_cast<std::size_t>(l.size));
  for (int r = 0; r < l.size; ++r) {
    if (r == l.rank) continue;
    MPI_Request ping = MPI_REQUEST_NULL, answer = MPI_REQUEST_NULL;
    MPI_Isend(&Liveness::kAnswer, 1, MPI_INT, r, kPingTag, l.comm, &ping);
    MPI_Irecv(&answer_buffers[r], 1, MPI_INT, r, kAnswerTag, l.comm, &answer);
    pings.push_back(ping);
    answers.push_back(answer);
    peers.push_back(r);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  std::vector<bool> answered(peers.size(), false);
  std::size_t pending = peers.size();
  while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
    answer_pings();  // the others' waits may be timing out now too, and asking this rank
    for (std::size_t i = 0; i < peers.size(); ++i) {
      if (answered[i]) continue;
      int done = 0;
      MPI_Test(&answers[i], &done, MPI_STATUS_IGNORE);
      if (done != 0) answered[i] = true, --pending;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<int> silent;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (!answered[i]) {
      // Cancelled and waited for (an unmatched receive completes at once), so MPI writes no answer into
      // answer_buffers once it is gone; one that arrived after all is an answer.
      MPI_Cancel(&answers[i]);
      MPI_Status status;
      MPI_Wait(&answers[i], &status);
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (cancelled != 0) silent.push_back(peers[i]);
    }
    // A ping to a rank that never takes it stays queued (its buffer is static): the job ends on this timeout.
    if (pings[i] != MPI_REQUEST_NULL) MPI_Request_free(&pings[i]);
  }
  return silent;
}

void linger_after_asking(double seconds) {
  if (state().comm == MPI_COMM_NULL || !state().asked) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    answer_pings();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string silent_ranks_note(double grace_s) {
  if (state().comm == MPI_COMM_NULL || state().size < 2) return "";
  const std::vector<int> silent = silent_ranks(grace_s);
  if (silent.empty()) {
    return "; every rank answers (they all wait: a deadlock, or one rank far behind the others)";
  }
  const std::string others = static_cast<int>(silent.size()) + 1 == state().size ? "" : ", every other rank does";
  return fmt::format("; {} {} {} not answer within {:g} s (stopped, stuck outside MPI, or dead){}",
                     silent.size() == 1 ? "rank" : "ranks", fmt::join(silent, ", "), silent.size() == 1 ? "does" : "do",
                     grace_s, others);
}

std::string timeout_cause_note() {
  const std::string silent = silent_ranks_note();
  return silent.empty() ? ": a peer is stuck or dead" : silent;
}

}  // namespace shardline::comm
