// Files a command writes: opened with the reason when that fails, and checked before long work, so that a
// wrong --out or --dump-logits path fails at once instead of after the measurement or the generation.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline {

// Opens path for writing, or throws ResourceError (exit 4) naming `what`, the path and the reason.
inline std::ofstream open_output_file(const std::string& path, std::ios::openmode mode, const char* what) {
  std::ofstream out(path, mode);
  if (!out) throw ResourceError(fmt::format("cannot write {} '{}': {}", what, path, std::strerror(errno)));
  return out;
}

// Closes a file open_output_file() gave, or throws ResourceError (exit 4): a full disk shows here, when the
// buffered bytes go out, not in the opening.
inline void close_output_file(std::ofstream& out, const std::string& path, const char* what) {
  out.close();
  if (!out) throw ResourceError(fmt::format("writing {} '{}' failed (disk full?)", what, path));
}

// Whether path can be written later, without changing it: opened for appending (an existing file keeps its
// bytes), and a file made only for the test is removed again. Throws as open_output_file does.
inline void require_writable_output(const std::string& path, const char* what) {
  // An empty name is a bad flag (exit 2), not a file the system could not create (ENOENT, exit 4).
  if (path.empty()) throw ConfigError(fmt::format("the {} name is empty; give a path", what));
  std::error_code ec;  // a path that cannot even be looked at fails the open below, with its reason
  if (std::filesystem::is_fifo(std::filesystem::status(path, ec))) {
    // Opening a FIFO for writing waits for a reader (probe --out held forever); without blocking it fails
    // at once when there is none, and a reader already there keeps its pipe.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      throw ResourceError(fmt::format("cannot write {} '{}': {}", what, path,
                                      errno == ENXIO ? "a FIFO that nobody reads" : std::strerror(errno)));
    }
    ::close(fd);
    return;
  }
  const bool existed = std::filesystem::exists(std::filesystem::symlink_status(path, ec));
  open_output_file(path, std::ios::binary | std::ios::app, what);
  if (!existed) std::filesystem::remove(path, ec);
}

}  // namespace shardline
