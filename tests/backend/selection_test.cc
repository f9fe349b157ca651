#include "backend/selection.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/gpu_type.h"
#include "sgpu/errors.h"
#include "sim/node_spec.h"

namespace sgpu::backend {
namespace {

std::string mismatch(const std::string& node, int gpus, const std::string& type,
                     FrontEnd front_end = FrontEnd::kCpp) {
  try {
    select_devices(sim::parse_node_spec(node), gpus, type, "sim", front_end);
  } catch (const AcceleratorMismatchError& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in: " << text;
}

TEST(Selection, DetectsTheTypeWhenUnset) {
  const Selection s = select_devices(sim::parse_node_spec("4xA10"), 2, "", "sim", FrontEnd::kCpp);
  EXPECT_EQ(s.gpu_type, "A10");
  EXPECT_EQ(s.device_indices, (std::vector<int>{0, 1}));
}

TEST(Selection, EveryPairOfDifferentTypesIsAMismatch) {
  for (const GpuModel& asked : gpu_models()) {
    for (const GpuModel& has : gpu_models()) {
      if (asked.type == has.type) continue;
      const std::string text = mismatch("2x" + std::string(has.type), 1, std::string(asked.type));
      expect_has(text, "gpu_type \"" + std::string(asked.type) + "\" requested");
      expect_has(text, "this node has 2 x " + std::string(has.type));
      expect_has(text, "gpu_type=\"" + std::string(has.type) + "\"");
    }
  }
}

TEST(Selection, MoreGpusThanTheNodeHas) {
  const std::string text = mismatch("4xH100", 8, "H100");
  expect_has(text, "8 x H100 requested");
  expect_has(text, "this node has 4 x H100");
  expect_has(text, "gpus=4 or fewer");
  expect_has(mismatch("4xH100", 5, ""), "pass gpus=4 or fewer");
}

TEST(Selection, TheAdviceNamesTheSettingsAsTheCallersFrontEndWritesThem) {
  expect_has(mismatch("4xH100", 5, "", FrontEnd::kCommand), "pass --gpus 4 or fewer");
  expect_has(mismatch("4xH100", 8, "H100", FrontEnd::kCommand), "pass --gpus 4 or fewer");
  expect_has(mismatch("2xA10", 1, "H100", FrontEnd::kCommand), "pass --gpu-type A10");
  expect_has(mismatch("4xH100+4xA10", 6, "", FrontEnd::kCommand), "name one in --gpu-type");
  expect_has(mismatch("4xH100+4xA10", 6, "", FrontEnd::kCpp), "name one in Options::gpu_type");
  expect_has(mismatch("4xH100+4xA10", 6, "", FrontEnd::kPython), "name one in gpu_type,");
}

TEST(Selection, UnknownTypeListsTheKnownOnes) {
  const std::string text = mismatch("8xH100", 1, "H1000");
  expect_has(text, "unknown gpu_type \"H1000\"");
  expect_has(text, known_gpu_types_text());
}

TEST(Selection, MixedNodeWithTooFewOfTheType) {
  expect_has(mismatch("4xH100+4xA10", 6, "A10"),
             "6 x A10 requested but this node has 4 x H100 + 4 x A10");
  const Selection s =
      select_devices(sim::parse_node_spec("4xH100+4xA10"), 3, "a10", "sim", FrontEnd::kCpp);
  EXPECT_EQ(s.gpu_type, "A10");
  EXPECT_EQ(s.device_indices, (std::vector<int>{4, 5, 6}));
  expect_has(mismatch("4xH100+4xA10", 6, ""), "mixes types");
}

TEST(Selection, NoGpuNamesTheSimulatedBackend) {
  Inventory none;
  none.unavailable_reason = "no CUDA driver";
  const std::string given = std::getenv("SGPU_BACKEND") ? std::getenv("SGPU_BACKEND") : "";
  ::unsetenv("SGPU_BACKEND");
  try {
    select_devices(none, 1, "", "cuda", FrontEnd::kCpp);
    FAIL();
  } catch (const AcceleratorMismatchError& e) {
    expect_has(e.what(), "no CUDA driver");
    expect_has(e.what(), "backend=\"sim\"");
  }
  // Where SGPU_BACKEND chose cuda, the advice is the variable's, not the option's.
  ::setenv("SGPU_BACKEND", "cuda", 1);
  try {
    select_devices(none, 1, "", "cuda", FrontEnd::kCpp);
    FAIL();
  } catch (const AcceleratorMismatchError& e) {
    expect_has(e.what(), "set SGPU_BACKEND=sim (SGPU_BACKEND=cuda decides the backend here");
  }
  if (given.empty()) {
    ::unsetenv("SGPU_BACKEND");
  } else {
    ::setenv("SGPU_BACKEND", given.c_str(), 1);
  }
}

}  // namespace
}  // namespace sgpu::backend
