// Runs a command line through /bin/sh and captures its exit code, stdout and stderr, with a time limit
// (coreutils `timeout`), so a hang fails the test instead of stalling the suite.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace shardline::test {

struct ProcessResult {
  int exit_code = -1;  // 124 when the time limit killed it
  std::string out;
  std::string err;
};

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline ProcessResult run_process(const std::string& command, int timeout_s = 120) {
  namespace fs = std::filesystem;
  static int counter = 0;
  const fs::path dir = fs::temp_directory_path();
  const std::string stem = (dir / ("shardline_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++))).string();
  const std::string out_path = stem + ".out", err_path = stem + ".err";
  const std::string full = "timeout -k 5 " + std::to_string(timeout_s) + " " + command + " </dev/null >" + out_path +
                           " 2>" + err_path;
  const int status = std::system(full.c_str());
  ProcessResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text_file(out_path);
  r.err = read_text_file(err_path);
  fs::remove(out_path);
  fs::remove(err_path);
  return r;
}

// Single-quotes an argument for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

inline std::string shardline_binary() { return SHARDLINE_BINARY; }

// How many times `what` occurs in text (error lines in a job's stderr, say).
inline std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace shardline::test
