// Base fixture for tests that run the real binary: a scratch folder of its own (removed afterwards), the
// environment Open MPI needs to run as root (CI runs as root), and the checks every such suite makes.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/process.h"

namespace shardline::test {

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("shardline_") + info->test_suite_name() + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // The start of an mpirun command line for np ranks on this host (oversubscribed: CI has 2 cores).
  static std::string mpirun(int np, const std::string& bind_to = "none") {
    return "mpirun --oversubscribe --bind-to " + bind_to + " -np " + std::to_string(np) + " ";
  }

  // A run that failed as bad input must: exit code `code`, exactly one error line, which says `expect`, and
  // no crash.
  static void expect_one_error_line(const ProcessResult& r, int code, const std::string& expect) {
    EXPECT_EQ(r.exit_code, code) << r.err;
    EXPECT_EQ(count_of(r.err, " error: "), 1u) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << "expected '" << expect << "' in: " << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  }

  std::filesystem::path dir_;
};

}  // namespace shardline::test
