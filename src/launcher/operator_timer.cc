#include "launcher/operator_timer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <unordered_map>

#include "launcher/accounting.h"

namespace sgpu::launcher {
namespace {

double product(const std::vector<long>& sizes, std::size_t from = 0) {
  double p = 1;
  for (std::size_t i = from; i < sizes.size(); ++i) p *= static_cast<double>(sizes[i]);
  return p;
}

// "float32", "bfloat16", ...: torch's names, as the roofline's peaks are keyed.
std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::Double:
      return "float64";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Float8_e4m3fn:
    case c10::ScalarType::Float8_e5m2:
      return "float8";
    default:
      return c10::toString(type);
  }
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

const std::set<std::string_view>& with_formulas() {
  static const std::set<std::string_view> names = {
      "aten::mm",
      "aten::addmm",
      "aten::bmm",
      "aten::baddbmm",
      "aten::mv",
      "aten::addmv",
      "aten::dot",
      "aten::_convolution",
      "aten::convolution",
      "aten::mkldnn_convolution",
      "aten::_slow_conv2d_forward",
      "aten::slow_conv3d_forward",
      "aten::_nnpack_spatial_convolution",
      "aten::convolution_backward",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
  return names;
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
  frame->has_formula = frame->aten && with_formulas().count(name) != 0;
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
  count_compute(std::string("aten.") + (fn.name() + 6), dtype_name(type), flops, bytes);
}

}  // namespace

double operator_flops(const std::string& name, const std::vector<std::vector<long>>& in,
                      const std::vector<std::vector<long>>& out) {
  auto arg = [&](std::size_t i) -> const std::vector<long>& {
    static const std::vector<long> none;
    return i < in.size() ? in[i] : none;
  };
  if (name == "aten::mm" && arg(0).size() == 2 && arg(1).size() == 2)
    return 2.0 * arg(0)[0] * arg(0)[1] * arg(1)[1];
  if (name == "aten::addmm" && arg(1).size() == 2 && arg(2).size() == 2)
    return 2.0 * arg(1)[0] * arg(1)[1] * arg(2)[1];
  if (name == "aten::bmm" && arg(0).size() == 3 && arg(1).size() == 3)
    return 2.0 * arg(0)[0] * arg(0)[1] * arg(0)[2] * arg(1)[2];
  if (name == "aten::baddbmm" && arg(1).size() == 3 && arg(2).size() == 3)
    return 2.0 * arg(1)[0] * arg(1)[1] * arg(1)[2] * arg(2)[2];
  if ((name == "aten::mv" || name == "aten::addmv") && !out.empty() && !out[0].empty()) {
    const auto& matrix = arg(name == "aten::mv" ? 0 : 1);
    return matrix.size() == 2 ? 2.0 * matrix[0] * matrix[1] : 0;
  }
  if (name == "aten::dot" && arg(0).size() == 1) return 2.0 * arg(0)[0];
  // A convolution: each output element is a dot product over the weight's other dimensions.
  const bool convolution =
      name == "aten::_convolution" || name == "aten::convolution" ||
      name == "aten::mkldnn_convolution" || name == "aten::_slow_conv2d_forward" ||
      name == "aten::slow_conv3d_forward" || name == "aten::_nnpack_spatial_convolution";
  if (convolution && !out.empty() && arg(1).size() >= 3)
    return 2.0 * product(out[0]) * product(arg(1), 1);
  if (name == "aten::convolution_backward" && arg(2).size() >= 3) {
    // grad_output, input, weight: the input's and the weight's gradients, each the forward's.
    const double forward = 2.0 * product(arg(0)) * product(arg(2), 1);
    double flops = 0;
    for (std::size_t i = 0; i < 2 && i < out.size(); ++i)
      if (!out[i].empty()) flops += forward;
    return flops;
  }
  // Attention over (batch, heads, length, head size): two matmuls forward, five backward.
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu" && arg(0).size() == 4 &&
      arg(1).size() == 4) {
    return 4.0 * product(arg(0)) * arg(1)[2];
  }
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward" && arg(1).size() == 4 &&
      arg(2).size() == 4) {
    return 10.0 * product(arg(1)) * arg(2)[2];
  }
  return 0;
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

}  // namespace sgpu::launcher
