// Two hosts for real: CTest's fixture (netns-hosts.sh up/down) makes two network namespaces joined by a
// veth pair, 10.200.0.1 (shl-host-a) and 10.200.0.2 (shl-host-b). mpirun runs on host a with a hostfile
// of both addresses and a launch agent that enters host b's namespace where ssh would log in; ranks talk
// TCP over the veth only. tp=2 and pp=2 across the hosts must reproduce the tiny-32k goldens; bad
// hostfiles and rank counts must fail with one clear line before any rank works.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/golden_run.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

namespace fs = std::filesystem;

class MultiHost : public GoldenCliTest {
 protected:
  void SetUp() override {
    GoldenCliTest::SetUp();
    const std::string dir = SHARDLINE_MULTIHOST_DIR;
    // The fixture must have made the hosts: missing ones are a failure, never a skip.
    ASSERT_TRUE(fs::exists(dir + "/hosts.json")) << "no test hosts at " << dir
                                                 << ": run through ctest (fixture multihost_up)";
    hosts_ = nlohmann::json::parse(read_text_file(dir + "/hosts.json"));
  }

  std::string host(int i, const char* key) const { return hosts_["hosts"][i][key].get<std::string>(); }
  std::string hostfile() const { return hosts_["hostfile"].get<std::string>(); }

  // mpirun started on host a, as a user would start it on a login node, with the flags that make the
  // namespaces behave like two machines: the agent instead of ssh, TCP only, on the veth's subnet only.
  std::string mpirun(const std::string& hostfile_path, int np, const std::string& extra = "") const {
    const std::string subnet = hosts_["subnet"].get<std::string>();
    return host(0, "run") + " mpirun --hostfile " + hostfile_path + " -np " + std::to_string(np) + " --bind-to none" +
           " --mca plm_rsh_agent " + hosts_["agent"].get<std::string>() + " --mca btl tcp,self" +
           " --mca btl_tcp_if_include " + subnet + " --mca oob_tcp_if_include " + subnet + " " + extra + " ";
  }

  // `run` of the tiny-32k golden prompts (their goldens in golden_) on a layout.
  std::string golden_run_args(int tp, int pp) {
    return golden_run("tiny-32k.bin", "--tp " + std::to_string(tp) + " --pp " + std::to_string(pp));
  }

  // Bytes host a has sent over its end of the veth pair.
  long sent_bytes() const {
    const ProcessResult r = run_process("ip -n " + host(0, "netns") + " -s -j link show dev " + host(0, "interface"), 30);
    return nlohmann::json::parse(r.out)[0]["stats64"]["tx"]["bytes"].get<long>();
  }

  void expect_goldens_across_hosts(int tp, int pp) {
    SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
    const std::string args = golden_run_args(tp, pp) + " --verbose";
    const long before = sent_bytes();
    const ProcessResult r = run_process(mpirun(hostfile(), tp * pp) + args, 180);
    const long sent = sent_bytes() - before;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_golden_ids(r.out, golden_.goldens, "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp));
    // Rank 0 ran on host a and rank 1 on host b, and MPI saw two nodes of one rank each.
    EXPECT_EQ(count_of(r.err, "] host " + host(0, "hostname") + " |"), 1u) << r.err;
    EXPECT_EQ(count_of(r.err, "] host " + host(1, "hostname") + " |"), 1u) << r.err;
    EXPECT_EQ(count_of(r.err, "MPI node " + host(0, "hostname") + ", local rank 0 of 1"), 1u) << r.err;
    EXPECT_EQ(count_of(r.err, "MPI node " + host(1, "hostname") + ", local rank 0 of 1"), 1u) << r.err;
    EXPECT_EQ(count_of(r.err, "launched by mpirun (rank"), 2u) << r.err;
    // The activations (pp) or partial sums (tp) of 4 prompts x 68 positions crossed the veth: at least one
    // dim-64 float vector per position, 4 x 68 x 256 bytes; in practice far more.
    EXPECT_GT(sent, 4 * 68 * 256) << "bytes host a sent over the veth";
    RecordProperty("veth_bytes_sent_tp" + std::to_string(tp) + "_pp" + std::to_string(pp), std::to_string(sent));
  }

  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = path(name);
    std::ofstream(file) << text;
    return file;
  }

  ProcessResult launch_check(const std::string& args) const {
    return run_process(shardline_binary() + " launch-check " + args, 30);
  }

  nlohmann::json hosts_;
};

TEST_F(MultiHost, ProbeReportsTheCrossHostLinkSeparately) {
  const std::string out = path("probe.json");
  const ProcessResult r = run_process(mpirun(hostfile(), 2) + shardline_binary() + " probe --quick --out " + out, 180);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("on 2 host(s)"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(read_text_file(out));
  EXPECT_EQ(j["nodes"], 2);
  EXPECT_TRUE(j["measurements"]["point_to_point"]["cross_host"]["measured"].get<bool>()) << r.out;
  EXPECT_FALSE(j["measurements"]["point_to_point"]["same_host"]["measured"].get<bool>()) << r.out;
  EXPECT_GT(j["links"]["cross_node"]["bandwidth_bytes_per_s"].get<double>(), 1e6);
  const std::string line = r.out.substr(r.out.find("cross host"));
  EXPECT_EQ(line.substr(0, line.find('\n')).find("not measured"), std::string::npos) << r.out;
}

TEST_F(MultiHost, Tp2AcrossTwoHostsReproducesTheGoldens) { expect_goldens_across_hosts(2, 1); }

TEST_F(MultiHost, Pp2AcrossTwoHostsReproducesTheGoldens) { expect_goldens_across_hosts(1, 2); }

TEST_F(MultiHost, LaunchCheckMapsTheHostfileAndWarnsOfASplitTpGroup) {
  const ProcessResult r = launch_check("--hostfile " + hostfile() + " --np 2 --tp 2 --pp 1");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(host(0, "address") + " rank 0, " + host(1, "address") + " rank 1"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("warning: the TP group of stage 0 (ranks 0-1) spans"), std::string::npos) << r.err;
  const ProcessResult pp = launch_check("--hostfile " + hostfile() + " --np 2 --tp 1 --pp 2");
  EXPECT_EQ(pp.exit_code, 0) << pp.err;
  EXPECT_TRUE(pp.err.empty()) << "a pipeline across hosts is the intended use: " << pp.err;
}

TEST_F(MultiHost, MalformedHostfilesGetOneLineNamingFileAndLine) {
  struct Case {
    std::string text, message;
  };
  const std::string a = host(0, "address"), b = host(1, "address");
  for (const Case& c : {Case{a + " slot=1\n" + b + " slots=1\n", ":1: unknown keyword 'slot'"},
                        Case{a + " slots=1\n" + b + " slots=two\n", ":2: slots='two' must be a whole number of ranks from 1 to 999999"},
                        Case{a + " slots=0\n", ":1: slots='0' must be a whole number of ranks from 1"},
                        Case{"# two hosts\n" + a + " " + b + "\n", ":2: unexpected '" + b + "'"},
                        Case{a + "," + b + " slots=2\n", ":1: '" + a + "," + b + "' names several hosts"},
                        Case{a + " slots=1\n" + a + " slots=1\n", ":2: '" + a + "' is already listed on line 1"},
                        Case{"# nothing but a comment\n", ": names no host"}}) {
    const std::string path = write("bad.hostfile", c.text);
    const ProcessResult r = launch_check("--hostfile " + path + " --np 2 --tp 2 --pp 1");
    EXPECT_EQ(r.exit_code, 2) << c.text << r.err;
    EXPECT_EQ(count_of(r.err, "] error: "), 1u) << r.err;
    EXPECT_NE(r.err.find(path + c.message), std::string::npos) << "for:\n" << c.text << "got: " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const ProcessResult missing = launch_check("--hostfile " + path("nope") + " --tp 2 --pp 1");
  EXPECT_EQ(missing.exit_code, 4) << missing.err;
  EXPECT_NE(missing.err.find("cannot open hostfile"), std::string::npos) << missing.err;
}

TEST_F(MultiHost, HostfileWithTooFewSlotsIsRefused) {
  const ProcessResult r = launch_check("--hostfile " + hostfile() + " --tp 2 --pp 2");
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(count_of(r.err, "] error: "), 1u) << r.err;
  EXPECT_NE(r.err.find("offers 2 slots (" + host(0, "address") + ":1, " + host(1, "address") + ":1) but tp=2 x pp=2 "
                       "needs 4 ranks"),
            std::string::npos)
      << r.err;
}

TEST_F(MultiHost, MoreRanksThanTheLayoutNeedsFailsFastWithOneLine) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string roomy = write("two-slots.hostfile", host(0, "address") + " slots=2\n" + host(1, "address") + " slots=2\n");
  // The preflight says so before mpirun starts anything ...
  const ProcessResult check = launch_check("--hostfile " + roomy + " --np 4 --tp 2 --pp 1");
  EXPECT_EQ(check.exit_code, 2) << check.err;
  EXPECT_NE(check.err.find("--np 4 starts 4 ranks but tp=2 x pp=1 uses 2"), std::string::npos) << check.err;
  // ... and if mpirun is started anyway, the ranks on both hosts agree on it and one of them says so.
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult r = run_process(mpirun(roomy, 4) + golden_run_args(2, 1), 60);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_of(r.err, "] error: "), 1u) << r.err;
  EXPECT_NE(r.err.find("does not match the 4 ranks"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_LT(seconds, 20) << "a wrong rank count must be rejected before any work";
}

}  // namespace
}  // namespace shardline::test
