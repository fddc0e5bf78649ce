#include "memory/bus_error_report.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace shardline::memory {

namespace {

// The handler may only use async-signal-safe calls: the message lives in fixed storage, written before
// the handler can see it (the release store of its length publishes it).
char g_line[1024];
std::atomic<std::size_t> g_length{0};
std::atomic<int> g_exit_code{1};

void on_bus_error(int) {
  const std::size_t length = g_length.load(std::memory_order_acquire);
  if (length > 0) {
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, g_line, length);
  }
  ::_exit(g_exit_code.load(std::memory_order_relaxed));
}

}  // namespace

void report_bus_errors(const std::string& line, int exit_code) {
  g_length.store(0, std::memory_order_release);  // a SIGBUS meanwhile prints nothing rather than half a line
  const std::size_t length = std::min(line.size(), sizeof(g_line));
  std::memcpy(g_line, line.data(), length);
  g_exit_code.store(exit_code, std::memory_order_relaxed);
  g_length.store(length, std::memory_order_release);
  struct sigaction action {};
  action.sa_handler = on_bus_error;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, nullptr);
}

}  // namespace shardline::memory
