// Error handling, in the two kinds the house style asks for:
//  1. Bugs and broken invariants: SL_CHECK, always compiled in. It prints the rank and file:line and aborts
//     the whole job through the abort hook (launch/ installs MPI_Abort once MPI is up).
//  2. Expected failures (bad flags, corrupt files, resources missing): the exception types below. main()
//     catches them, prints one line naming the rank and the cause, and exits with the type's exit code.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace shardline {

// Exit codes a script can rely on (documented in README "Exit codes").
enum class ExitCode : int {
  kOk = 0,
  kRuntime = 1,   // anything unexpected
  kConfig = 2,    // bad flags, impossible layout, bad hostfile
  kFormat = 3,    // corrupt / truncated / inconsistent input file
  kResource = 4,  // not enough memory, no GPU, file missing
  kComm = 5,      // a peer died or a collective timed out
};

class Error : public std::runtime_error {
 public:
  Error(const std::string& what, ExitCode code) : std::runtime_error(what), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what, ExitCode::kConfig) {}
};
class FormatError : public Error {
 public:
  explicit FormatError(const std::string& what) : Error(what, ExitCode::kFormat) {}
};
class ResourceError : public Error {
 public:
  explicit ResourceError(const std::string& what) : Error(what, ExitCode::kResource) {}
};
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what, ExitCode::kComm) {}
};

// The exit code and message for any exception: an Error's own; running out of memory is a missing resource
// (a --batch or model too large for the machine); anything else is unexpected.
struct Failure {
  ExitCode code;
  std::string message;
};
inline Failure failure_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return {error->code(), e.what()};
  // (Not bad_array_new_length, a bad_alloc too: that is a size computed wrong, a bug.)
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr && dynamic_cast<const std::bad_array_new_length*>(&e) == nullptr) {
    return {ExitCode::kResource, "out of memory (is --batch, the number of prompts or the model too large for this "
                                 "machine's memory?)"};
  }
  return {ExitCode::kRuntime, fmt::format("unexpected: {}", e.what())};
}

namespace detail {
// The process-wide hook SL_CHECK calls; launch/ points it at MPI_Abort when MPI is initialised.
inline void (*&abort_hook())(int) {
  static void (*hook)(int) = nullptr;
  return hook;
}
inline std::string& rank_tag() {
  static std::string tag = "[r0]";
  return tag;
}
[[noreturn]] inline void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "%s FATAL %s:%d: check failed: %s%s%s\n", rank_tag().c_str(), file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  if (auto hook = abort_hook()) hook(static_cast<int>(ExitCode::kRuntime));
  std::abort();
}
}  // namespace detail

inline void set_abort_hook(void (*hook)(int)) { detail::abort_hook() = hook; }

// This rank's one line for an expected failure, "[rN ...] error: <message>", after whatever stdout holds so
// far (so the two streams read in order where they share a terminal).
inline void print_error_line(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s error: %s\n", detail::rank_tag().c_str(), message.c_str());
}

}  // namespace shardline

#define SL_CHECK(cond)                                                                  \
  do {                                                                                  \
    if (!(cond)) ::shardline::detail::check_failed(#cond, __FILE__, __LINE__, {});      \
  } while (0)

#define SL_CHECK_MSG(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond))                                                                        \
      ::shardline::detail::check_failed(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
