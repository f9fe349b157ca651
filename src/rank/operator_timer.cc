#include "rank/operator_timer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "collectives/interposer.h"
#include "model/kernels.h"
#include "rank/accounting.h"

namespace sgpu::rank {
namespace {

double product(const std::vector<long>& sizes, std::size_t from = 0) {
  double p = 1;
  for (std::size_t i = from; i < sizes.size(); ++i) p *= static_cast<double>(sizes[i]);
  return p;
}

struct Tensors {
  std::vector<std::vector<long>> sizes;  // per argument; empty for one that is no tensor
  double bytes = 0;
  std::optional<c10::ScalarType> floating;  // the first floating tensor's dtype
};

void add(Tensors& out, const at::Tensor& t) {
  if (!t.defined()) {
    out.sizes.emplace_back();
    return;
  }
  out.sizes.emplace_back(t.sizes().begin(), t.sizes().end());
  double elements = 1;  // a broadcast dimension (stride 0) is read once
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) != 0) elements *= static_cast<double>(t.size(d));
  out.bytes += elements * static_cast<double>(t.element_size());
  if (!out.floating && at::isFloatingType(t.scalar_type())) out.floating = t.scalar_type();
}

Tensors tensors_of(c10::ArrayRef<const c10::IValue> values) {
  Tensors out;
  for (const c10::IValue& v : values) {
    if (v.isTensor()) {
      add(out, v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) add(out, t);
    } else {
      out.sizes.emplace_back();
    }
  }
  return out;
}

// Whether the operator runs no kernel over its tensors: a view, or an allocation. Known by
// name after its first call, in each thread.
bool runs_no_kernel(const at::RecordFunction& fn) {
  static const std::set<std::string> allocations = {"aten::empty",
                                                    "aten::empty_like",
                                                    "aten::empty_strided",
                                                    "aten::new_empty",
                                                    "aten::new_empty_strided",
                                                    "aten::resize_",
                                                    "aten::set_",
                                                    "aten::detach",
                                                    "aten::alias",
                                                    "aten::_unsafe_view",
                                                    "aten::lift_fresh"};
  // An operator's name is its schema's, whose characters stay where they are.
  thread_local std::unordered_map<const char*, bool> known;
  const char* name = fn.name();
  if (auto it = known.find(name); it != known.end()) return it->second;
  bool none = allocations.count(name) != 0;
  if (!none) {
    if (const auto op = fn.operator_name()) {
      if (const auto handle = c10::Dispatcher::singleton().findOp(*op)) {
        const auto& returns = handle->schema().returns();
        none = !returns.empty() && returns[0].alias_info() != nullptr &&
               !returns[0].alias_info()->isWrite();
      }
    }
  }
  known.emplace(name, none);
  return none;
}

using Sizes = std::vector<std::vector<long>>;
using Formula = double (*)(const Sizes& in, const Sizes& out);

const std::vector<long>& arg(const Sizes& in, std::size_t i) {
  static const std::vector<long> none;
  return i < in.size() ? in[i] : none;
}

// A matmul of (m, k) by (k, n) (`dims` 2), or the same over a batch: (b, m, k) by (b, k, n)
// (`dims` 3), its matrices the arguments at `a` and `a` + 1; kOther for other operands.
template <std::size_t a, std::size_t dims>
model::KernelShape matmul_shape(const Sizes& in) {
  const auto &x = arg(in, a), &y = arg(in, a + 1);
  if (x.size() != dims || y.size() != dims) return {};
  auto d = [](long v) { return static_cast<double>(v); };
  const double batch = dims == 3 ? d(x[0]) : 1;
  return {model::KernelKind::kMatmul, batch, d(x[dims - 2]), d(y[dims - 1]), d(x[dims - 1])};
}
template <std::size_t a, std::size_t dims>
double matmul(const Sizes& in, const Sizes&) {
  const model::KernelShape s = matmul_shape<a, dims>(in);
  return s.kind == model::KernelKind::kMatmul ? 2.0 * s.batch * s.m * s.n * s.k : 0;
}
// A matrix (at `a`) by a vector.
template <std::size_t a>
double matrix_vector(const Sizes& in, const Sizes&) {
  const auto& x = arg(in, a);
  return x.size() == 2 ? 2.0 * x[0] * x[1] : 0;
}
double dot(const Sizes& in, const Sizes&) {
  return arg(in, 0).size() == 1 ? 2.0 * arg(in, 0)[0] : 0;
}
// A convolution: each output element is a dot product over the weight's other dimensions.
double convolution(const Sizes& in, const Sizes& out) {
  return !out.empty() && arg(in, 1).size() >= 3 ? 2.0 * product(out[0]) * product(arg(in, 1), 1)
                                                : 0;
}
// grad_output, input, weight: the input's and the weight's gradients, each the forward's.
double convolution_backward(const Sizes& in, const Sizes& out) {
  if (arg(in, 2).size() < 3) return 0;
  const double forward = 2.0 * product(arg(in, 0)) * product(arg(in, 2), 1);
  double flops = 0;
  for (std::size_t i = 0; i < 2 && i < out.size(); ++i)
    if (!out[i].empty()) flops += forward;
  return flops;
}
// Attention over (batch, heads, length, head size): two matmuls forward, five backward.
double attention(const Sizes& in, const Sizes&) {
  return arg(in, 0).size() == 4 && arg(in, 1).size() == 4
             ? 4.0 * product(arg(in, 0)) * arg(in, 1)[2]
             : 0;
}
double attention_backward(const Sizes& in, const Sizes&) {
  return arg(in, 1).size() == 4 && arg(in, 2).size() == 4
             ? 10.0 * product(arg(in, 1)) * arg(in, 2)[2]
             : 0;
}

// torch's flop counter's formulas (torch/utils/flop_counter.py), by operator.
const std::map<std::string_view, Formula>& formulas() {
  static const std::map<std::string_view, Formula> table = {
      {"aten::mm", &matmul<0, 2>},
      {"aten::addmm", &matmul<1, 2>},
      {"aten::bmm", &matmul<0, 3>},
      {"aten::baddbmm", &matmul<1, 3>},
      {"aten::mv", &matrix_vector<0>},
      {"aten::addmv", &matrix_vector<1>},
      {"aten::dot", &dot},
      {"aten::_convolution", &convolution},
      {"aten::convolution", &convolution},
      {"aten::mkldnn_convolution", &convolution},
      {"aten::_slow_conv2d_forward", &convolution},
      {"aten::slow_conv3d_forward", &convolution},
      {"aten::_nnpack_spatial_convolution", &convolution},
      {"aten::convolution_backward", &convolution_backward},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", &attention},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", &attention_backward}};
  return table;
}

// What the kernel model needs of the operator (NOTE [The kernel model]): a matmul's batch,
// rows, columns and inner size from its operands (linear's from its input and weight); an
// attention kernel by its name.
model::KernelShape kernel_shape(std::string_view name, const Sizes& in) {
  using model::KernelKind;
  if (name.find("attention") != std::string_view::npos) return {KernelKind::kAttention};
  if (name == "aten::linear") {
    const auto &x = arg(in, 0), &w = arg(in, 1);
    if (x.empty() || w.size() != 2 || x.back() <= 0) return {};
    const double k = static_cast<double>(x.back());
    return {KernelKind::kMatmul, 1, product(x) / k, static_cast<double>(w[0]), k};
  }
  if (name == "aten::mm") return matmul_shape<0, 2>(in);
  if (name == "aten::addmm") return matmul_shape<1, 2>(in);
  if (name == "aten::bmm") return matmul_shape<0, 3>(in);
  if (name == "aten::baddbmm") return matmul_shape<1, 3>(in);
  return {};
}

// What the start callback saw, for the end one.
struct Frame final : at::ObserverContext {
  Frame* parent = nullptr;       // the frame it runs inside, any
  Frame* aten_parent = nullptr;  // the aten operator it runs inside, through any other frame
  bool in_collective = false;    // it runs inside a c10d operation
  bool collective = false;       // it is one
  bool aten = false;
  bool has_formula = false;
  double inner_flops = 0;  // what the operators inside it counted, when it has no formula
  Tensors in;
};

thread_local Frame* t_innermost = nullptr;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  auto frame = std::make_unique<Frame>();
  const char* name = fn.name();
  frame->aten = std::strncmp(name, "aten::", 6) == 0;
  frame->has_formula = frame->aten && formulas().count(name) != 0;
  if (Frame* parent = t_innermost) {
    frame->parent = parent;
    frame->aten_parent = parent->aten ? parent : parent->aten_parent;
    frame->in_collective = parent->in_collective || parent->collective;
  }
  frame->collective = std::strncmp(name, "c10d::", 6) == 0;
  t_innermost = frame.get();
  if (frame->aten && !frame->in_collective && (frame->aten_parent == nullptr || frame->has_formula))
    frame->in = tensors_of(fn.inputs());
  return frame;
}

// The outermost aten operator is the kernel (a composite one as the one kernel a fused
// implementation runs): its tensors in and out are its memory traffic, and its FLOPs its
// formula's or, without one, those of the operators it ran (linear's addmm). Frames that
// are not aten's (the autograd engine's, a user's) are seen through; what runs inside a
// collective is the collective's.
void on_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* frame = static_cast<Frame*>(context);
  t_innermost = frame->parent;
  if (!frame->aten || frame->in_collective) return;
  Frame* parent = frame->aten_parent;
  if (parent != nullptr && parent->has_formula) return;  // the parent's formula counts it
  double flops = frame->inner_flops;
  std::optional<Tensors> out;
  if (frame->has_formula) {
    const std::vector<c10::IValue>& outputs = fn.outputs();
    out = tensors_of(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()));
    flops = operator_flops(fn.name(), frame->in.sizes, out->sizes);
  }
  if (parent != nullptr) {
    parent->inner_flops += flops;
    return;
  }
  if (runs_no_kernel(fn)) return;
  if (!out) {
    const std::vector<c10::IValue>& outputs = fn.outputs();
    out = tensors_of(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()));
  }
  const double bytes = frame->in.bytes + out->bytes;
  if (flops == 0 && bytes == 0) return;
  const c10::ScalarType type =
      out->floating.value_or(frame->in.floating.value_or(c10::ScalarType::Float));
  count_compute(std::string("aten.") + (fn.name() + 6), collectives::dtype_name(type), flops, bytes,
                kernel_shape(fn.name(), frame->in.sizes));
}

}  // namespace

double operator_flops(const std::string& name, const std::vector<std::vector<long>>& in,
                      const std::vector<std::vector<long>>& out) {
  const auto it = formulas().find(name);
  return it != formulas().end() ? it->second(in, out) : 0;
}

void time_operators() {
  static std::once_flag once;
  std::call_once(once, [] {
    at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                              .needsInputs(true)
                              .needsOutputs(true)
                              .scopes({at::RecordScope::FUNCTION}));
  });
}

}  // namespace sgpu::rank
