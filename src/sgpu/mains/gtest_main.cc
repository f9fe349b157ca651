// main() for GoogleTest binaries that launch ranks (sgpu::gtest_main): the binary is also
// every rank's program, so sgpu::init comes first.
#include <gtest/gtest.h>

#include "sgpu/runtime.h"

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
