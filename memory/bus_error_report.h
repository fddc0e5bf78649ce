// A mapped file that shrinks under the process (truncated, or replaced by `cp` over it while a run maps it)
// turns the next read of a page past its new end into SIGBUS, which kills the process with nothing said
// (under mpirun: a signal dump and a stack trace). Hugepage mappings that cannot be backed fault the same
// way. This turns that death into the job's usual one line and a meaningful exit code.
#pragma once

#include <string>

namespace shardline::memory {

// From now on a SIGBUS writes `line` (a whole message, newline included, e.g. "[r1] error: ...\n") to
// stderr and ends the process with exit_code. Calling it again replaces the line (a rank's log tag changes
// once its place in the job is known). Lines longer than 1 KiB are cut.
void report_bus_errors(const std::string& line, int exit_code);

}  // namespace shardline::memory
