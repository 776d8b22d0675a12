// The CUDA error plumbing and device detection, which must work on machines without a GPU (this test is cpu-labelled).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compressors/framework/payload.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_device.h"

namespace gradcomp {
namespace {

TEST(CudaCheck, FailingCallThrowsCudaErrorWithLocation) {
  const int line = __LINE__ + 2;
  try {
    GRADCOMP_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "GRADCOMP_CUDA_CHECK did not throw";
  } catch (const CudaError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda_check_test.cc"), std::string::npos) << what;
    EXPECT_NE(what.find(std::string("cuda_check_test.cc:") + std::to_string(line)), std::string::npos) << what;
    EXPECT_NE(what.find("invalid argument"), std::string::npos) << what;  // CUDA's own description
  }
}

TEST(CudaCheck, SuccessDoesNotThrow) { EXPECT_NO_THROW(GRADCOMP_CUDA_CHECK(cudaSuccess)); }

TEST(CudaDevice, CountNeverThrowsAndReasonMatches) {
  const int count = cuda_device_count();
  EXPECT_GE(count, 0);
  const std::string reason = cuda_unavailable_reason();
  if (count == 0) {
    EXPECT_NE(reason.find("no CUDA device"), std::string::npos) << reason;
    // (Without a driver every runtime call keeps failing: that error is sticky by CUDA's design, not ours.)
  } else {
    EXPECT_TRUE(reason.empty()) << reason;
    // With a device, detection must not leave an error behind for the next launch check to find.
    EXPECT_NO_THROW(GRADCOMP_CUDA_LAUNCH_CHECK());
  }
}

TEST(CudaPath, CudaTensorWithoutDeviceFailsWithAnError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device is present; gpu tests cover the working path";
  auto compressor = make_compressor("fp16");
  std::vector<float> host(16, 1.0f);
  // A fake "device" pointer: the CUDA path must reject it with an Error before touching it.
  TensorView grad(host.data(), host.size(), DType::kF32, Device::cuda(0));
  std::vector<std::byte> out(compressor->max_payload_bytes(host.size()));
  CompressContext ctx;
  ctx.name = "w";
  EXPECT_THROW(compressor->compress(grad, out, ctx), Error);
}

}  // namespace
}  // namespace gradcomp
