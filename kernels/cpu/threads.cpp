#include <omp.h>

#include "kernels/cpu/ops.h"

namespace shardline::kernels::cpu {

namespace {
int g_num_threads = 1;
}

int set_num_threads(int n_threads) {
  int previous = g_num_threads;
  g_num_threads = n_threads < 1 ? 1 : n_threads;
  omp_set_num_threads(g_num_threads);
  return previous;
}

int num_threads() { return g_num_threads; }

void run_on_each_thread(void (*fn)(int thread, void* context), void* context) {
  const int n_threads = num_threads();
#pragma omp parallel num_threads(n_threads)
  fn(omp_get_thread_num(), context);
}

void run_team_impl(void (*body)(void* context, Team team), void* context) {
  const int n_threads = num_threads();
  if (n_threads == 1) {
    body(context, Team{});
    return;
  }
#pragma omp parallel num_threads(n_threads)
  body(context, Team{omp_get_thread_num(), omp_get_num_threads()});
}

void team_barrier() {
#pragma omp barrier
}

void parallel_for_impl(int n, void (*body)(void* context, int item, int thread), void* context) {
  if (n <= 1 || g_num_threads == 1) {
    for (int i = 0; i < n; ++i) body(context, i, 0);
    return;
  }
#pragma omp parallel num_threads(g_num_threads)
  {
    const int t = omp_get_thread_num();
    const Band band = thread_band(n, t, omp_get_num_threads());
    for (int i = band.begin; i < band.end; ++i) body(context, i, t);
  }
}

}  // namespace shardline::kernels::cpu
