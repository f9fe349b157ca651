#include "sim/node_spec.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "sgpu/errors.h"

namespace sgpu::sim {
namespace {

TEST(NodeSpec, Parses) {
  const auto inv = parse_node_spec("8xH100");
  ASSERT_EQ(inv.gpus.size(), 8u);
  EXPECT_EQ(inv.gpus[7].index, 7);
  EXPECT_EQ(inv.gpus[0].type, "H100");
  EXPECT_EQ(inv.summary(), "8 x H100");
}

TEST(NodeSpec, MixedAndMemory) {
  const auto inv = parse_node_spec("4xh100+4xA10:12GiB");
  ASSERT_EQ(inv.gpus.size(), 8u);
  EXPECT_EQ(inv.gpus[4].type, "A10");
  EXPECT_EQ(inv.gpus[4].memory_bytes, 12ull << 30);
  // Without a size, what torch reports as an H100's total capacity: 79.11 GiB.
  EXPECT_EQ(inv.gpus[0].memory_bytes, 81008ull << 20);
  EXPECT_EQ(inv.summary(), "4 x H100 + 4 x A10");
}

TEST(NodeSpec, EveryMemoryUnitMeansWhatItSays) {
  // Binary units are powers of two (G and M as GiB and MiB); GB and MB are SI, powers of
  // ten: 40GB is 7.4% less than 40GiB, and a spec that read one as the other would say so.
  const std::pair<const char*, unsigned long long> sizes[] = {
      {"40GiB", 40ull << 30},    {"40G", 40ull << 30},   {"40GB", 40'000'000'000ull},
      {"512MiB", 512ull << 20},  {"512M", 512ull << 20}, {"512MB", 512'000'000ull},
      {"1GB", 1'000'000'000ull}, {"1MB", 1'000'000ull},
  };
  for (const auto& [memory, bytes] : sizes) {
    const auto inv = parse_node_spec(std::string("2xH100:") + memory);
    EXPECT_EQ(inv.gpus[1].memory_bytes, bytes) << memory;
  }
}

TEST(NodeSpec, BadSpecsSayWhatIsWrong) {
  for (const char* bad : {"", "H100", "0xH100", "8xH1000", "8xH100+", "8xH100:12XB", "x8"}) {
    try {
      parse_node_spec(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("COUNTxTYPE"), std::string::npos) << e.what();
    }
  }
}

// The types of the devices `visible` leaves of 2xH100+2xA10, in the order seen.
std::string seen(const char* visible) {
  const auto inv = visible_devices(parse_node_spec("2xH100+2xA10"), visible);
  std::string out;
  for (std::size_t i = 0; i < inv.gpus.size(); ++i) {
    EXPECT_EQ(inv.gpus[i].index, static_cast<int>(i)) << visible;  // renumbered from 0
    out += (i == 0 ? "" : ",") + inv.gpus[i].type;
  }
  return out;
}

TEST(VisibleDevices, RenumbersAndHidesAsCudaDoes) {
  EXPECT_EQ(seen(nullptr), "H100,H100,A10,A10");  // unset: every device
  EXPECT_EQ(seen("2,0"), "A10,H100");             // in the order written
  EXPECT_EQ(seen(" 3 , 1"), "A10,H100");          // spaces around entries
  EXPECT_EQ(seen("0,2,-1,1"), "H100,A10");        // the list ends at -1
  EXPECT_EQ(seen("1,4,0"), "H100");               // ... and at an index past the node
  EXPECT_EQ(seen("0,x,1"), "H100");               // ... and at what is no index
  EXPECT_EQ(seen("1,1"), "");                     // a device named twice: none
  EXPECT_EQ(seen(""), "");                        // an empty list: none
  EXPECT_EQ(seen("GPU-00000000-0000-0000-0000-000000000003"), "A10");  // a UUID
  EXPECT_EQ(seen("GPU-00000000-0000-0000-0000-00000000000"), "");      // a prefix of four
}

TEST(VisibleDevices, NoneLeftSaysWhy) {
  const auto inv = visible_devices(parse_node_spec("8xH100"), "-1");
  EXPECT_TRUE(inv.gpus.empty());
  EXPECT_NE(inv.unavailable_reason.find("CUDA_VISIBLE_DEVICES=\"-1\" hides every GPU"),
            std::string::npos)
      << inv.unavailable_reason;
}

}  // namespace
}  // namespace sgpu::sim
