// The FLOPs the operator timer (rank/operator_timer.h) gives each operator: torch's
// flop counter's formulas (torch/utils/flop_counter.py), from the tensors' sizes alone.
#include "rank/operator_timer.h"

#include <gtest/gtest.h>

namespace sgpu::rank {
namespace {

// torch's flop counter's formulas (torch/utils/flop_counter.py), by operator.
TEST(OperatorFlops, AreTorchsFormulas) {
  EXPECT_EQ(operator_flops("aten::mm", {{4, 5}, {5, 6}}, {{4, 6}}), 2.0 * 4 * 5 * 6);
  EXPECT_EQ(operator_flops("aten::addmm", {{6}, {4, 5}, {5, 6}}, {{4, 6}}), 2.0 * 4 * 5 * 6);
  EXPECT_EQ(operator_flops("aten::bmm", {{3, 4, 5}, {3, 5, 6}}, {{3, 4, 6}}), 2.0 * 3 * 4 * 5 * 6);
  EXPECT_EQ(operator_flops("aten::baddbmm", {{3, 4, 6}, {3, 4, 5}, {3, 5, 6}}, {{3, 4, 6}}),
            2.0 * 3 * 4 * 5 * 6);
  // A 3x3 convolution of 8 to 16 channels over a 10x10 output, batch 2.
  EXPECT_EQ(operator_flops("aten::mkldnn_convolution", {{2, 8, 12, 12}, {16, 8, 3, 3}, {16}},
                           {{2, 16, 10, 10}}),
            2.0 * (2 * 16 * 10 * 10) * (8 * 3 * 3));
  // Its backward: the input's and the weight's gradients, each the forward's.
  EXPECT_EQ(
      operator_flops("aten::convolution_backward", {{2, 16, 10, 10}, {2, 8, 12, 12}, {16, 8, 3, 3}},
                     {{2, 8, 12, 12}, {16, 8, 3, 3}, {}}),
      2 * 2.0 * (2 * 16 * 10 * 10) * (8 * 3 * 3));
  EXPECT_EQ(operator_flops("aten::_scaled_dot_product_flash_attention_for_cpu",
                           {{2, 4, 128, 64}, {2, 4, 256, 64}, {2, 4, 256, 64}}, {{2, 4, 128, 64}}),
            4.0 * 2 * 4 * 128 * 64 * 256);
  EXPECT_EQ(operator_flops("aten::add", {{4, 5}, {4, 5}}, {{4, 5}}), 0);
  EXPECT_EQ(operator_flops("aten::mm", {{4, 5}}, {}), 0);  // not its arguments: no formula
}

}  // namespace
}  // namespace sgpu::rank
