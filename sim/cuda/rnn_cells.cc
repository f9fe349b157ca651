// The fused LSTM and GRU cells on sim (NOTE [RNN cells on sim]).
#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sim/cuda/parts.h"

// NOTE [RNN cells on sim]
// torch's native LSTM and GRU (what nn.LSTM and nn.GRU run on a GPU when cuDNN is not
// taken, as on sim: torch.backends.cudnn.is_acceptable says no) compute each step's gates
// with matmuls, then call a fused cell, an operator CUDA alone has a kernel for:
// aten::_thnn_fused_lstm_cell and aten::_thnn_fused_gru_cell, and their backwards. Here
// each is the same arithmetic made of operators on the cuda tensors, so it runs where
// every other operator on sim does (redirect.cc) and its memory is the device's.
//
// What the caller can see is CUDA's: the cells take float, double and half (AT_DISPATCH's
// refusal of another dtype, in its words), half is computed in float and rounded once, the
// sizes are checked as CUDA's kernels check them, and the workspace one forward hands its
// backward has CUDA's layout (LSTM: the gates i, f, g, o after their activations; GRU: r,
// z, n, the previous hidden state, and the hidden state's n gate with its bias).

namespace sgpu::sim::cuda {
namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

bool given(const OptionalTensor& t) { return t.has_value() && t->defined(); }

// CUDA's kernels are dispatched over float, double and half.
void check_dtype(const char* kernel, const Tensor& t) {
  const auto type = t.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kHalf, '"', kernel,
              "\" not implemented for '", c10::toString(type), "'");
}

// Half is computed in float, as CUDA's accumulate type.
Tensor widened(const Tensor& t) { return t.scalar_type() == at::kHalf ? t.to(at::kFloat) : t; }

// Gates (batch, factor x hidden) from the input and from the hidden state, with optional
// biases (factor x hidden) and the previous state (batch, hidden).
void check_cell_sizes(const char* kernel, const Tensor& input_gates, const Tensor& hidden_gates,
                      const OptionalTensor& input_bias, const OptionalTensor& hidden_bias,
                      int64_t factor, const Tensor& previous) {
  const at::TensorArg in{input_gates, "input_gates", 1};
  const at::TensorArg hidden{hidden_gates, "hidden_gates", 2};
  const at::TensorArg state{previous, "prev_hidden", 5};
  at::checkDim(kernel, in, 2);
  at::checkSameSize(kernel, in, hidden);
  if (given(input_bias)) {
    const at::TensorArg bias{*input_bias, "input_bias", 3};
    at::checkDim(kernel, bias, 1);
    at::checkNumel(kernel, bias, input_gates.size(1));
    TORCH_CHECK(given(hidden_bias), kernel, ": input_bias is given and hidden_bias is not");
    at::checkSameSize(kernel, bias, at::TensorArg{*hidden_bias, "hidden_bias", 4});
  }
  at::checkDim(kernel, state, 2);
  at::checkNumel(kernel, state, input_gates.size(0) * input_gates.size(1) / factor);
}

// Each gate's pre-activation: the input's part, the hidden state's, and both biases.
std::vector<Tensor> gate_sums(const Tensor& input_gates, const Tensor& hidden_gates,
                              const OptionalTensor& input_bias, const OptionalTensor& hidden_bias,
                              int64_t factor) {
  Tensor sum = widened(input_gates) + widened(hidden_gates);
  if (given(input_bias)) sum = sum + widened(*input_bias) + widened(*hidden_bias);
  return sum.chunk(factor, 1);
}

std::tuple<Tensor, Tensor, Tensor> lstm_cell(const Tensor& input_gates, const Tensor& hidden_gates,
                                             const Tensor& cx, const OptionalTensor& input_bias,
                                             const OptionalTensor& hidden_bias) {
  constexpr const char* kernel = "_thnn_fused_lstm_cell_cuda";
  check_dtype(kernel, input_gates);
  check_cell_sizes(kernel, input_gates, hidden_gates, input_bias, hidden_bias, 4, cx);
  const auto sums = gate_sums(input_gates, hidden_gates, input_bias, hidden_bias, 4);
  const Tensor i = sums[0].sigmoid();
  const Tensor f = sums[1].sigmoid();
  const Tensor g = sums[2].tanh();
  const Tensor o = sums[3].sigmoid();
  const Tensor cy = f * widened(cx) + i * g;
  const Tensor hy = o * cy.tanh();
  const auto type = input_gates.scalar_type();
  return {hy.to(type), cy.to(type), at::cat({i, f, g, o}, 1).to(type)};
}

std::tuple<Tensor, Tensor, Tensor> lstm_cell_backward(const OptionalTensor& grad_hy,
                                                      const OptionalTensor& grad_cy,
                                                      const Tensor& cx, const Tensor& cy,
                                                      const Tensor& workspace, bool has_bias) {
  if (!given(grad_hy) && !given(grad_cy)) return {};
  check_dtype("_thnn_fused_lstm_cell_cuda_backward", workspace);
  const Tensor& some_grad = given(grad_hy) ? *grad_hy : *grad_cy;
  constexpr const char* checked = "fused_lstm_cell_backward";
  at::checkDim(checked, at::TensorArg{some_grad, "grad", 1}, 2);
  at::checkSize(checked, at::TensorArg{cx, "cx", 3}, some_grad.sizes());
  at::checkSize(checked, at::TensorArg{cy, "cy", 4}, some_grad.sizes());
  at::checkNumel(checked, at::TensorArg{workspace, "workspace", 5}, some_grad.numel() * 4);

  const auto gates = widened(workspace).chunk(4, 1);
  const Tensor &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
  const Tensor zero = at::zeros_like(i);
  const Tensor go = given(grad_hy) ? widened(*grad_hy) : zero;
  const Tensor goc = given(grad_cy) ? widened(*grad_cy) : zero;
  const Tensor tanh_cy = widened(cy).tanh();
  const Tensor through_c = go * o * (1 - tanh_cy * tanh_cy) + goc;
  const Tensor grad_i = through_c * g * (1 - i) * i;
  const Tensor grad_f = through_c * widened(cx) * (1 - f) * f;
  const Tensor grad_g = through_c * i * (1 - g * g);
  const Tensor grad_o = go * tanh_cy * (1 - o) * o;
  const auto type = workspace.scalar_type();
  Tensor grad_gates = at::cat({grad_i, grad_f, grad_g, grad_o}, 1).to(type);
  Tensor grad_bias = has_bias ? grad_gates.sum(0) : Tensor();
  return {grad_gates, (through_c * f).to(type), grad_bias};
}

std::tuple<Tensor, Tensor> gru_cell(const Tensor& input_gates, const Tensor& hidden_gates,
                                    const Tensor& hx, const OptionalTensor& input_bias,
                                    const OptionalTensor& hidden_bias) {
  constexpr const char* kernel = "_thnn_fused_gru_cell_cuda";
  check_dtype(kernel, input_gates);
  check_cell_sizes(kernel, input_gates, hidden_gates, input_bias, hidden_bias, 3, hx);
  const auto in = widened(input_gates).chunk(3, 1);
  const auto hidden = widened(hidden_gates).chunk(3, 1);
  Tensor r_sum = in[0] + hidden[0];
  Tensor z_sum = in[1] + hidden[1];
  Tensor n_in = in[2];
  Tensor n_hidden = hidden[2];
  if (given(input_bias)) {
    const auto b1 = widened(*input_bias).chunk(3);
    const auto b2 = widened(*hidden_bias).chunk(3);
    r_sum = r_sum + b1[0] + b2[0];
    z_sum = z_sum + b1[1] + b2[1];
    n_in = n_in + b1[2];
    n_hidden = n_hidden + b2[2];
  }
  const Tensor r = r_sum.sigmoid();
  const Tensor z = z_sum.sigmoid();
  const Tensor n = (n_in + r * n_hidden).tanh();
  const Tensor previous = widened(hx);
  const Tensor hy = n + z * (previous - n);
  const auto type = input_gates.scalar_type();
  return {hy.to(type), at::cat({r, z, n, previous, n_hidden}, 1).to(type)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> gru_cell_backward(const Tensor& grad_hy,
                                                                     const Tensor& workspace,
                                                                     bool has_bias) {
  check_dtype("_thnn_fused_gru_cell_cuda_backward", grad_hy);
  constexpr const char* checked = "fused_gru_cell_backward";
  at::checkDim(checked, at::TensorArg{grad_hy, "grad_hy", 1}, 2);
  at::checkSize(checked, at::TensorArg{workspace, "workspace", 2},
                {grad_hy.size(0), grad_hy.size(1) * 5});
  const auto saved = widened(workspace).chunk(5, 1);
  const Tensor &r = saved[0], &z = saved[1], &n = saved[2], &hx = saved[3];
  const Tensor& n_hidden = saved[4];
  const Tensor go = widened(grad_hy);
  const Tensor grad_z = go * (hx - n) * (1 - z) * z;
  const Tensor grad_n = go * (1 - z) * (1 - n * n);
  const Tensor grad_r = grad_n * n_hidden * (1 - r) * r;
  const auto type = workspace.scalar_type();
  Tensor grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1).to(type);
  Tensor grad_hidden_gates = at::cat({grad_r, grad_z, grad_n * r}, 1).to(type);
  Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = grad_input_gates.sum(0);
    grad_hidden_bias = grad_hidden_gates.sum(0);
  }
  return {grad_input_gates, grad_hidden_gates, (go * z).to(type), grad_input_bias,
          grad_hidden_bias};
}

}  // namespace

bool cover_rnn_cell(torch::Library& aten, const std::string& name) {
  if (name == "aten::_thnn_fused_lstm_cell") {
    aten.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
  } else if (name == "aten::_thnn_fused_lstm_cell_backward_impl") {
    aten.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward));
  } else if (name == "aten::_thnn_fused_gru_cell") {
    aten.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
  } else if (name == "aten::_thnn_fused_gru_cell_backward") {
    aten.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
  } else {
    return false;
  }
  return true;
}

}  // namespace sgpu::sim::cuda
