// Configuration and accelerator-mismatch errors through the public API: the message is
// checked, and no process is started.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

#include "sgpu/config.h"
#include "sgpu/sgpu.h"
#include "testing/process_table.h"
#include "testing/sim_options.h"

namespace {

int noop(int x) { return x; }

template <class E>
std::string error_of(const sgpu::Options& options, std::size_t arg_bytes = 0) {
  auto fn = [](std::string s) { return s.size(); };
  try {
    if (arg_bytes > 0) {
      sgpu::distributed(fn, options).distributed(std::string(arg_bytes, 'a'));
    } else {
      sgpu::distributed(noop, options).distributed(1);
    }
  } catch (const E& e) {
    EXPECT_TRUE(sgpu::testing::children().empty()) << "a process was started";
    return e.what();
  }
  ADD_FAILURE() << "no error of the expected type";
  return "";
}

sgpu::Options sim() {
  sgpu::Options options = sgpu::testing::sim(1);
  return options;
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in: " << text;
}

TEST(ConfigError, GpusBelowOne) {
  auto o = sim();
  o.gpus = 0;
  expect_has(error_of<sgpu::ConfigError>(o), "gpus must be at least 1, got 0");
}

TEST(ConfigError, ZeroOrNegativeTimeout) {
  auto o = sim();
  o.timeout = std::chrono::milliseconds(0);
  expect_has(error_of<sgpu::ConfigError>(o), "timeout must be positive");
  o.timeout = std::chrono::milliseconds(-5);
  expect_has(error_of<sgpu::ConfigError>(o), "kNoTimeout");
}

TEST(ConfigError, ShapeOnlyComputeIsForPythonFunctionsAndNamesItsValues) {
  auto o = sim();
  o.sim.compute = "shapes";
  expect_has(error_of<sgpu::ConfigError>(o), "sim.compute=\"shapes\" is for Python code");
  expect_has(error_of<sgpu::ConfigError>(o), "a C++ function's ranks compute on data");
  o.sim.compute = "fake";
  expect_has(error_of<sgpu::ConfigError>(o),
             "sim.compute=\"fake\" is not what simulated ranks compute: use \"values\"");
  o.sim.compute.clear();
  ::setenv("SGPU_SIM_COMPUTE", "shape", 1);
  expect_has(error_of<sgpu::ConfigError>(o),
             "SGPU_SIM_COMPUTE=shape is not \"values\" or \"shapes\"");
  ::unsetenv("SGPU_SIM_COMPUTE");
}

TEST(ConfigError, UnknownBackend) {
  auto o = sim();
  o.backend = "tpu";
  ::unsetenv("SGPU_BACKEND");
  expect_has(error_of<sgpu::ConfigError>(o), "unknown backend \"tpu\"");
  ::setenv("SGPU_BACKEND", "sim", 1);
}

TEST(ConfigError, SgpuBackendOverridesTheOption) {
  auto o = sim();
  ::setenv("SGPU_BACKEND", "tpu", 1);
  expect_has(error_of<sgpu::ConfigError>(o),
             "SGPU_BACKEND=tpu is not \"auto\", \"cuda\" or \"sim\"");
  // An invalid option is invalid whatever overrides it.
  ::setenv("SGPU_BACKEND", "sim", 1);
  o.backend = "nccl";
  expect_has(error_of<sgpu::ConfigError>(o), "unknown backend \"nccl\"");
  ::setenv("SGPU_BACKEND", "sim", 1);
}

TEST(ConfigError, ConsoleRankOutOfRange) {
  auto o = sim();
  o.gpus = 2;
  o.console_ranks = std::vector<int>{2};
  expect_has(error_of<sgpu::ConfigError>(o), "console_ranks names rank 2");
}

TEST(ConfigError, BadSimulatedNode) {
  auto o = sim();
  o.sim.node = "8xQ9";
  expect_has(error_of<sgpu::ConfigError>(o), "unknown GPU type \"Q9\"");
}

TEST(ConfigError, UnknownSimulatedTransport) {
  auto o = sim();
  o.sim.transport = "tcp";
  expect_has(error_of<sgpu::ConfigError>(o), "sim.transport=\"tcp\" is not a transport");
  o.sim.transport.clear();
  ::setenv("SGPU_SIM_TRANSPORT", "ib", 1);
  expect_has(error_of<sgpu::ConfigError>(o), "SGPU_SIM_TRANSPORT=ib is not \"shm\" or \"gloo\"");
  ::unsetenv("SGPU_SIM_TRANSPORT");
}

TEST(ConfigError, ArgumentsOverTheLimit) {
  auto o = sim();
  o.max_payload_bytes = 1000;
  expect_has(error_of<sgpu::ConfigError>(o, 5000), "over Options::max_payload_bytes (1000)");
}

// The front end travels with each call's options (NOTE [Front ends]): calls in one process
// for the sgpu command, for Python and for C++ are each told in their own words.
TEST(ConfigError, EachCallsAdviceIsInItsOwnCallersWords) {
  const std::pair<sgpu::FrontEnd, std::string> said[] = {
      {sgpu::FrontEnd::kCommand, "--timeout must be positive, got -1000 ms; use --timeout none"},
      {sgpu::FrontEnd::kPython, "timeout must be positive, got -1000 ms; use timeout=None"},
      {sgpu::FrontEnd::kCpp,
       "Options::timeout must be positive, got -1000 ms; use sgpu::kNoTimeout"},
      {sgpu::FrontEnd::kCommand, "--timeout must be positive"},
  };
  for (const auto& [front_end, text] : said) {
    auto o = sim();
    o.front_end = front_end;
    o.timeout = std::chrono::seconds(-1);
    expect_has(error_of<sgpu::ConfigError>(o), text);
  }
  auto o = sim();
  o.front_end = sgpu::FrontEnd::kPython;
  o.sim.transport = "tcp";
  expect_has(error_of<sgpu::ConfigError>(o), "sim_transport=\"tcp\" is not a transport");
}

TEST(Mismatch, TypeTheNodeLacks) {
  auto o = sim();
  o.sim.node = "4xA10";
  o.gpu_type = "H100";
  expect_has(error_of<sgpu::AcceleratorMismatchError>(o),
             "gpu_type \"H100\" requested but this node has 4 x A10; pass gpu_type=\"A10\"");
}

TEST(Mismatch, MoreGpusThanTheNode) {
  auto o = sim();
  o.sim.node = "2xH200";
  o.gpus = 4;
  expect_has(error_of<sgpu::AcceleratorMismatchError>(o), "pass gpus=2 or fewer");
}

TEST(Mismatch, SgpuSimChoosesTheNode) {
  auto o = sim();
  o.gpu_type = "H100";
  ::setenv("SGPU_SIM", "1xL4", 1);
  expect_has(error_of<sgpu::AcceleratorMismatchError>(o), "this node has 1 x L4");
  ::unsetenv("SGPU_SIM");
}

TEST(Mismatch, AutoWithoutAGpuNamesTheSimulatedBackend) {
  if (sgpu::is_rank()) GTEST_SKIP();
  auto o = sim();
  o.backend = "auto";
  ::unsetenv("SGPU_BACKEND");
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // no GPU, even on a GPU machine
  const std::string text = error_of<sgpu::AcceleratorMismatchError>(o);
  expect_has(text, "backend \"auto\" found no GPU");
  expect_has(text, "SGPU_BACKEND=sim");
  ::setenv("SGPU_BACKEND", "sim", 1);
  ::unsetenv("CUDA_VISIBLE_DEVICES");  // the simulated node honours it too
}

#if SGPU_WITH_CUDA
TEST(Mismatch, CudaWithoutAGpuSaysWhyAndNamesTheSimulatedBackend) {
  auto o = sim();
  o.backend = "cuda";
  ::unsetenv("SGPU_BACKEND");
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // no GPU, even on a GPU machine
  const std::string text = error_of<sgpu::AcceleratorMismatchError>(o);
  ::setenv("SGPU_BACKEND", "sim", 1);
  ::unsetenv("CUDA_VISIBLE_DEVICES");  // the simulated node honours it too
  expect_has(text, "backend \"cuda\" offers none (");
  expect_has(text, "backend=\"sim\"");
}
#endif

TEST(Mismatch, DetectedTypeIsReported) {
  auto o = sim();
  o.sim.node = "2xA100";
  auto launch = sgpu::distributed(noop, o).launch(5);
  EXPECT_EQ(launch.gpu_type(), "A100");
  EXPECT_EQ(launch.wait(), (std::vector<int>{5}));
}

}  // namespace
