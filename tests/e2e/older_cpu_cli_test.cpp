// The real binary on CPUs older than the one it runs on, emulated by qemu-user: an AVX2 CPU (Haswell) and
// the x86-64 baseline (qemu64). QEMU's TCG implements instructions up to AVX2 and none of AVX-512, so an
// AVX-512 instruction outside the kernels chosen for the CPU (isa.h) dies here of SIGILL whatever the host
// is. Until session 30 the AVX-512 row kernels' table was built on every CPU, and every run on an AVX2-only
// EPYC died that way; the suite on an AVX-512 host could not see it.
//
// fp32 must give the goldens on each level; bf16 and int8 must give, emulated, the tokens the same level
// gives natively (`--isa`, which steps the kernels down on the host).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/golden_run.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

constexpr const char* kModel = "mini-gqa.bin";

struct EmulatedCpu {
  const char* qemu_cpu;  // qemu-x86_64 -cpu
  const char* isa;       // the kernel level shardline picks there (isa_name)
};
constexpr EmulatedCpu kCpus[] = {{"Haswell-noTSX", "avx2"}, {"qemu64", "portable"}};

// Emulation is 10-30x slower than the host: a generous limit per run.
constexpr int kEmulatedTimeoutS = 400;

class OlderCpu : public GoldenCliTest {
 protected:
  void SetUp() override {
    GoldenCliTest::SetUp();
#if !defined(__x86_64__)
    GTEST_SKIP() << "qemu-x86_64 emulates x86-64 CPUs on an x86-64 host only";
#endif
    const ProcessResult which = run_process("sh -c 'command -v qemu-x86_64'", 10);
    if (which.exit_code != 0) {
      if (in_ci()) FAIL() << "qemu-x86_64 missing under CI=true (scripts/install-deps.sh installs qemu-user)";
      GTEST_SKIP() << "qemu-x86_64 missing (apt-get install qemu-user)";
    }
  }
  static std::string emulated(const EmulatedCpu& cpu) { return std::string("qemu-x86_64 -cpu ") + cpu.qemu_cpu + " "; }
};

TEST_F(OlderCpu, Fp32ReproducesTheGoldensOnEachKernelLevel) {
  for (const EmulatedCpu& cpu : kCpus) {
    const ProcessResult r = run_process(emulated(cpu) + golden_run(kModel, "--verbose"), kEmulatedTimeoutS);
    expect_goldens(r, golden_.goldens, std::string("emulated ") + cpu.qemu_cpu);
    EXPECT_NE(r.err.find(std::string("weights fp32 on ") + cpu.isa + " kernels"), std::string::npos)
        << cpu.qemu_cpu << " runs the " << cpu.isa << " kernels:\n" << r.err;
  }
}

// 12 steps of each golden prompt: TCG runs the AVX2 bf16 kernel's widening some 6x slower than the fp32
// kernel (64 steps took three minutes).
TEST_F(OlderCpu, Bf16AndInt8GiveTheTokensOfTheSameLevelOnTheHost) {
  const GoldenRun golden = prepare_golden_run(kModel, path("prompts"));
  std::string flags = golden.flags;
  const std::size_t steps = flags.find("--steps 64");
  ASSERT_NE(steps, std::string::npos) << "golden_run.h's flags no longer say --steps 64: " << flags;
  flags.replace(steps, 10, "--steps 12");
  const std::string base = shardline_binary() + " run " + flags + " --device cpu --weights-dtype ";
  for (const EmulatedCpu& cpu : kCpus) {
    for (const char* dtype : {"bf16", "int8"}) {
      const std::string what = std::string(dtype) + " on emulated " + cpu.qemu_cpu;
      const ProcessResult native = run_process(base + dtype + " --isa " + cpu.isa, 120);
      ASSERT_EQ(native.exit_code, 0) << what << " (native)\n" << native.err;
      const ProcessResult r = run_process(emulated(cpu) + base + dtype, kEmulatedTimeoutS);
      ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.err;
      ASSERT_EQ(ids_of_json_lines(r.out).size(), golden.goldens.size()) << what << "\n" << r.out;
      EXPECT_EQ(ids_of_json_lines(r.out), ids_of_json_lines(native.out)) << what;
    }
  }
}

}  // namespace
}  // namespace shardline::test
