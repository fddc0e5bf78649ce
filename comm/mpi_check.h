// MPI return codes as exceptions: the communicators set MPI_ERRORS_RETURN, so a failed call comes back as a
// code, which becomes a CommError (exit code 5) carrying what was being done and MPI's own message.
#pragma once

#include <mpi.h>

#include <string>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::comm {

inline void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(fmt::format("MPI {} failed: {}", what, std::string(text, length)));
}

}  // namespace shardline::comm
