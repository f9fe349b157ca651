#include "backend/gpu_type.h"

#include <gtest/gtest.h>

namespace sgpu::backend {
namespace {

TEST(GpuType, NormalisesDriverNames) {
  EXPECT_EQ(normalize_device_name("NVIDIA H100 80GB HBM3"), "H100");
  EXPECT_EQ(normalize_device_name("NVIDIA H100 PCIe"), "H100");
  EXPECT_EQ(normalize_device_name("NVIDIA H100 NVL"), "H100");
  EXPECT_EQ(normalize_device_name("NVIDIA H200"), "H200");
  EXPECT_EQ(normalize_device_name("NVIDIA A10"), "A10");
  EXPECT_EQ(normalize_device_name("NVIDIA A10G"), "A10G");
  EXPECT_EQ(normalize_device_name("NVIDIA A100-SXM4-80GB"), "A100");
  EXPECT_EQ(normalize_device_name("NVIDIA L40S"), "L40S");
  EXPECT_EQ(normalize_device_name("Tesla V100-SXM2-16GB"), "V100");
}

TEST(GpuType, EveryTableDeviceNameNormalisesToItsType) {
  for (const GpuModel& model : gpu_models()) {
    EXPECT_EQ(normalize_device_name(model.device_name), model.type) << model.device_name;
  }
}

TEST(GpuType, UserInputIsCaseInsensitive) {
  EXPECT_EQ(parse_gpu_type("h100"), "H100");
  EXPECT_EQ(parse_gpu_type("GPUType.H100"), "H100");  // serverless_gpu's enum, as text
  EXPECT_EQ(parse_gpu_type("gputype.a10"), "A10");
  EXPECT_EQ(parse_gpu_type("GPUType."), std::nullopt);
  EXPECT_EQ(parse_gpu_type("H100"), "H100");
  EXPECT_EQ(parse_gpu_type("l40s"), "L40S");
  EXPECT_EQ(parse_gpu_type("H1000"), std::nullopt);
  EXPECT_EQ(parse_gpu_type(""), std::nullopt);
}

}  // namespace
}  // namespace sgpu::backend
