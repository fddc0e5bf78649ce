// Files a command reads (a tokenizer, a cluster or probe file, a hostfile, a prompts file) are checked
// before they are opened: open() on a named pipe waits for a writer, so a FIFO given by mistake would hang
// the job instead of failing, and a folder would read as an empty or unreadable file.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline {

// ResourceError (exit 4) naming `what` and the path unless it is a regular file (links followed).
inline void require_regular_file(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw ResourceError(fmt::format("cannot open {} '{}': {}", what, path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw ResourceError(fmt::format("cannot open {} '{}': not a regular file", what, path));
}

}  // namespace shardline
