// Files a command reads are checked before they are opened, so that a wrong path fails at once with the
// reason: a folder would read as an empty or unreadable file, and a model or tokenizer must be a regular
// file (each is opened twice: its format is sniffed first, and open() on a named pipe would wait for a
// writer). Text inputs (prompts, hostfiles, cluster files) may be pipes: `--prompts-file /dev/stdin`,
// `--hostfile <(scontrol show hostnames)`.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace shardline
