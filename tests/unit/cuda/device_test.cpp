// Device detection and its failure modes. Runs in every build and never skips: on this CI machine (no
// NVIDIA driver) it checks that "no GPU" is a clean answer with a reason and that every device resource
// then fails with ResourceError naming that reason, never a crash; on a GPU machine it checks the device's
// properties instead.
#include "kernels/cuda/device.h"

#include <string>

#include <gtest/gtest.h>

#include "common/error.h"

namespace shardline::kernels::cuda {
namespace {

// SHARDLINE_EXPECT_CUDA is what configure decided (tests/CMakeLists.txt); the library must agree.
TEST(CudaDevice, BuildFlagMatchesTheLibrary) { EXPECT_EQ(built_with_cuda(), SHARDLINE_EXPECT_CUDA != 0); }

TEST(CudaDevice, CountIsZeroWithAReasonOrPositiveWithout) {
  const DeviceCount devices = device_count();
  const DeviceCount again = device_count();  // a second query must not be spoiled by the first's error state
  EXPECT_EQ(devices.count, again.count);
  EXPECT_EQ(devices.reason, again.reason);
  if (devices.count == 0) {
    EXPECT_FALSE(devices.reason.empty());
    if (!built_with_cuda()) {
      EXPECT_NE(devices.reason.find("built without CUDA"), std::string::npos) << devices.reason;
    } else {
      // This machine has the toolkit but no driver: cudaGetDeviceCount's own error name must be in the reason.
      EXPECT_NE(devices.reason.find("cudaError"), std::string::npos) << devices.reason;
    }
  } else {
    EXPECT_TRUE(devices.reason.empty()) << devices.reason;
  }
}

TEST(CudaDevice, LocalRanksSpreadRoundRobin) {
  EXPECT_EQ(device_for_local_rank(0, 8), 0);
  EXPECT_EQ(device_for_local_rank(7, 8), 7);
  EXPECT_EQ(device_for_local_rank(5, 4), 1);
  EXPECT_EQ(device_for_local_rank(3, 1), 0);
}

TEST(CudaDevice, WithoutADeviceEveryResourceIsAResourceErrorWithTheReason) {
  const DeviceCount devices = device_count();
  if (devices.count > 0) {
    // The GPU machine's side of the same contract: real properties, and a bad index is still a clean error.
    const DeviceProperties props = device_properties(0);
    EXPECT_FALSE(props.name.empty());
    EXPECT_GE(props.sm_major, 7);
    EXPECT_GT(props.memory_bytes, 0u);
    EXPECT_FALSE(props.pci_bus_id.empty());
    EXPECT_THROW(select_device(devices.count), ResourceError);
    return;
  }
  auto expect_resource_error = [&](auto&& action, const char* what) {
    try {
      action();
      ADD_FAILURE() << what << " succeeded without a device";
    } catch (const ResourceError& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.code(), ExitCode::kResource);
      // The caller's one error line must say why: the reason device_count() gives, or CUDA's own error.
      const bool explains = message.find(devices.reason) != std::string::npos ||
                            message.find("cudaError") != std::string::npos;
      EXPECT_TRUE(explains) << what << ": " << message;
    }
  };
  expect_resource_error([] { select_device(0); }, "select_device");
  expect_resource_error([] { device_properties(0); }, "device_properties");
  expect_resource_error([] { DeviceBuffer buffer(1024); }, "DeviceBuffer");
  expect_resource_error([] { Stream stream(StreamPriority::kHigh); }, "Stream");
  expect_resource_error([] { PinnedBuffer buffer(1024); }, "PinnedBuffer");
}

}  // namespace
}  // namespace shardline::kernels::cuda
