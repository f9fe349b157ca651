// main() for sgpu's test binaries: the binary is also every rank's program.
#include <gtest/gtest.h>

#include "sgpu/runtime.h"

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
