// Files a command reads are checked before they are opened, so that a wrong path fails at once with the
// reason: a folder would read as an empty or unreadable file, and a model or tokenizer must be a regular
// file (each is opened twice: its format is sniffed first, and open() on a named pipe would wait for a
// writer). Text inputs (prompts, hostfiles, cluster files) may be pipes: `--prompts-file /dev/stdin`,
// `--hostfile <(scontrol show hostnames)`.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline {

enum class InputKind { kRegularFile, kFileOrPipe };

// ResourceError (exit 4) naming `what`, the path and the reason unless it can be read as `kind` asks.
inline void require_input_file(const std::string& path, const char* what, InputKind kind) {
  struct stat st {};
  const char* problem = nullptr;
  if (::stat(path.c_str(), &st) != 0) {
    problem = std::strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    problem = "a folder, not a file";
  } else if (kind == InputKind::kRegularFile && !S_ISREG(st.st_mode)) {
    problem = "not a regular file";
  } else if (::access(path.c_str(), R_OK) != 0) {
    problem = std::strerror(errno);
  }
  if (problem != nullptr) throw ResourceError(fmt::format("cannot open {} '{}': {}", what, path, problem));
}

// All of a text input that may be a pipe (kFileOrPipe), or ResourceError naming `what` and why: a pipe or
// terminal must give its next bytes within timeout_s (a pipe nobody writes held every rank of a job in this
// read, before any of them could time out), and the whole at most max_bytes (/dev/zero grew without end).
// Opened without blocking, so a FIFO without a writer waits in poll(), where the timeout holds.
// timeout_flag: the flag that sets timeout_s, named in the timeout's message (null: a fixed bound).
inline std::string read_text_input(const std::string& path, const char* what, double timeout_s, std::size_t max_bytes,
                                   const char* timeout_flag = nullptr) {
  require_input_file(path, what, InputKind::kFileOrPipe);
  const auto too_large = [&] {
    return ResourceError(fmt::format("{} '{}' holds more than {} MiB; is it the right file?", what, path, max_bytes >> 20));
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    throw too_large();  // (unread)
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw ResourceError(fmt::format("cannot open {} '{}': {}", what, path, std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const int timeout_ms = std::isinf(timeout_s) ? -1 : static_cast<int>(std::min(timeout_s * 1000.0, double{INT_MAX}));
  std::string text;
  char chunk[1 << 16];
  for (;;) {
    pollfd ready{fd, POLLIN, 0};
    const int n_ready = ::poll(&ready, 1, timeout_ms);
    if (n_ready < 0 && errno == EINTR) continue;
    if (n_ready < 0) throw ResourceError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
    if (n_ready == 0) {
      throw ResourceError(fmt::format("{} '{}' gave nothing for {} s{}: a pipe nobody writes to? Write its text to a "
                                      "file{}",
                                      what, path, timeout_s, timeout_flag ? fmt::format(" ({})", timeout_flag) : "",
                                      timeout_flag ? fmt::format(", or raise {}", timeout_flag) : ""));
    }
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) throw ResourceError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
    if (n == 0) return text;
    if (text.size() + static_cast<std::size_t>(n) > max_bytes) throw too_large();
    text.append(chunk, static_cast<std::size_t>(n));
  }
}

// How long a hostfile, rankfile or cluster file given as a pipe (`--hostfile <(scontrol show hostnames)`) may
// take to give its next bytes, and the most it may hold: a FIFO nobody wrote to held `launch-check` and
// `plan` forever.
inline constexpr double kPipedTextTimeoutS = 30.0;
inline constexpr std::size_t kMaxTextInputBytes = std::size_t{64} << 20;

}  // namespace shardline
