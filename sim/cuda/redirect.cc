// Every operator's CUDA kernel on sim (NOTE [CUDA on sim]): the CPU kernel, run on CPU
// views of the cuda tensors' storage.
//
// One boxed kernel serves every operator: it checks the devices of the tensors as CUDA's
// kernels do, replaces each cuda tensor on the stack by a CPU view of the same storage
// (same sizes, strides and offset), makes a random operator given no generator draw from
// the device's (DeviceDraws), runs the operator's CPU kernel inside the output device's DeviceScope
// (so what it allocates is that device's memory), and hands back cuda tensors: an
// argument the operator returns (in place, out=) as the tensor the caller gave, with any
// metadata the CPU kernel changed (resize_, set_) carried over; a new tensor, or a view,
// as a cuda tensor over its storage, whose allocator becomes the device's so it grows
// there and says whose it is (device_of).
//
// A storage's own device stays the CPU's: views made inside a CPU kernel take their
// device from their storage and must be CPU tensors there. A cuda tensor says its device
// itself (CudaTensorImpl), and so views of it go through this kernel too, which makes
// them cuda tensors over the same storage.
//
// Sparse (COO) cuda tensors take the same road under the SparseCUDA key: a SparseCPU tensor
// over CPU views of the tensor's indices and values stands in for it, the operator's
// SparseCPU kernel runs, and a sparse result comes back as a sparse cuda tensor over its
// parts' storage (an argument changed in place gets the result's parts).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <atomic>
#include <cctype>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "sim/cuda/generator.h"
#include "sim/cuda/parts.h"
#include "sim/cuda/sim_cuda.h"
#include "sim/memory/device_allocator.h"

namespace sgpu::sim::cuda {
namespace {

// A tensor on cuda:N over a storage in host memory: its device is its own, where a plain
// TensorImpl takes its storage's. Copies of its metadata (detach, .data, set_data) carry
// the device over.
class CudaTensorImpl final : public c10::TensorImpl {
 public:
  CudaTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, c10::Device device)
      : TensorImpl(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype) {
    device_opt_ = device;
  }
};

// The storage is memory of `device` from now on: it grows there, and says so (device_of).
void claim(c10::StorageImpl* storage, c10::Device device) {
  c10::Allocator* allocator = memory::cuda_device_allocator(device.index());
  if (storage->allocator() != allocator) storage->set_allocator(allocator);
}

// A cuda tensor on `device` over the storage of `cpu` (made by a CPU kernel).
at::Tensor as_cuda(const at::Tensor& cpu, c10::Device device) {
  claim(cpu.storage().unsafeGetStorageImpl(), device);
  auto impl = c10::make_intrusive<CudaTensorImpl>(c10::Storage(cpu.storage()), cpu.dtype(), device);
  impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
  return at::Tensor(std::move(impl));
}

// Copies, which CUDA runs between any two GPUs of a process (peer copies): their tensors
// may be on different cuda devices.
bool copies_between_devices(const c10::OperatorName& name) {
  static const std::set<std::string> names = {"aten::copy_", "aten::_copy_from",
                                              "aten::_copy_from_and_resize"};
  return names.count(name.name) != 0;
}

// Indexing, whose CUDA kernels take indices on the CPU or on the indexed tensor's GPU.
bool indexes(const c10::OperatorName& name) {
  static const std::set<std::string> names = {
      "aten::index",     "aten::index_put_",    "aten::_index_put_impl_",
      "aten::index_put", "aten::_unsafe_index", "aten::_unsafe_index_put"};
  return names.count(name.name) != 0;
}

// Operators that take host tensors beside cuda ones on a GPU: copies between devices, and
// indexing, whose CUDA kernels move CPU indices over.
bool takes_host_tensors(const c10::OperatorName& name) {
  return copies_between_devices(name) || indexes(name);
}

// "aten::addmm" -> "wrapper_CUDA_addmm", as CUDA's generated kernels name themselves.
std::string kernel_name(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return "wrapper_CUDA_" + name.substr(name.find("::") + 2);
}

[[noreturn]] void devices_differ(c10::Device common, c10::Device other,
                                 const c10::OperatorHandle& op, const std::string& argument) {
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              common, " and ", other, "! (when checking argument for argument ", argument,
              " in method ", kernel_name(op), ")");
}

// A cuda tensor of a compressed sparse (CSR, CSC, BSR, BSC) or other unstrided layout: CUDA
// on sim serves strided tensors, whose storage a CPU view shares, and sparse COO ones, whose
// two parts are strided; the others are refused.
[[noreturn]] void not_strided(const c10::OperatorHandle& op, const at::Tensor& t) {
  std::string layout = c10::str(t.layout());  // "SparseCsr", "SparseBsr", ...
  for (char& c : layout) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  refuse("sgpu: " + op.schema().name() + " on a " + layout +
         " cuda tensor: CUDA on sim serves strided (dense) and sparse COO tensors only, so "
         "compressed sparse and other layouts on a simulated GPU are not simulated. Convert "
         "with .to_sparse() (COO), keep them on the CPU (their CPU kernels run), or run this "
         "code on the cuda backend (a GPU node)");
}

// `to`, a sparse tensor, takes `from`'s shape and flags, over `indices` and `values` (views
// of `from`'s parts on another device).
void set_sparse(at::SparseTensorImpl* to, const at::SparseTensorImpl& from,
                const at::Tensor& indices, const at::Tensor& values) {
  to->raw_resize_(from.sparse_dim(), from.dense_dim(), from.sizes());
  to->set_indices_and_values_unsafe(indices, values);
  to->set_coalesced(from.coalesced());
}

// `to` takes `from`'s shape, flags and parts, as cuda tensors on `device`.
void set_sparse_on(at::SparseTensorImpl* to, const at::SparseTensorImpl& from, c10::Device device) {
  set_sparse(to, from, as_cuda(from.indices(), device), as_cuda(from.values(), device));
}

// A sparse cuda tensor on `device` over the parts of `cpu` (made by a SparseCPU kernel).
at::Tensor sparse_as_cuda(const at::Tensor& cpu, c10::Device device) {
  c10::DeviceGuard on(device);  // the empty parts a SparseTensorImpl starts with
  at::Tensor cuda = at::detail::make_tensor<at::SparseTensorImpl>(
      c10::DispatchKeySet(c10::DispatchKey::SparseCUDA), cpu.dtype());
  set_sparse_on(at::sparse::get_sparse_impl(cuda), *at::sparse::get_sparse_impl(cpu), device);
  return cuda;
}

// A SparseCPU tensor over CPU views of sparse cuda tensor `cuda`'s indices and values.
at::Tensor sparse_cpu_view(const at::Tensor& cuda) {
  const at::SparseTensorImpl& from = *at::sparse::get_sparse_impl(cuda);
  at::Tensor cpu = at::detail::make_tensor<at::SparseTensorImpl>(
      c10::DispatchKeySet(c10::DispatchKey::SparseCPU), cuda.dtype());
  set_sparse(at::sparse::get_sparse_impl(cpu), from, cpu_view(from.indices()),
             cpu_view(from.values()));
  return cpu;
}

// Whether a SparseCPU kernel left `view` (sparse_cpu_view(original)) as it was made.
bool sparse_unchanged(const at::Tensor& view, const at::Tensor& original) {
  const at::SparseTensorImpl& after = *at::sparse::get_sparse_impl(view);
  const at::SparseTensorImpl& before = *at::sparse::get_sparse_impl(original);
  auto same_part = [](const at::Tensor& cpu, const at::Tensor& cuda) {
    return cpu.storage().is_alias_of(cuda.storage()) && cpu.sizes() == cuda.sizes() &&
           cpu.strides() == cuda.strides() && cpu.storage_offset() == cuda.storage_offset();
  };
  return after.sparse_dim() == before.sparse_dim() && after.dense_dim() == before.dense_dim() &&
         after.sizes() == before.sizes() && after.coalesced() == before.coalesced() &&
         same_part(after.indices(), before.indices()) && same_part(after.values(), before.values());
}

// Random operators that take no generator: they draw from the CPU's default one.
bool draws_without_a_generator(const c10::OperatorName& name) {
  static const std::set<std::string> names = {
      "aten::rand",         "aten::randn",          "aten::randint",
      "aten::randperm",     "aten::rand_like",      "aten::randn_like",
      "aten::randint_like", "aten::native_dropout", "aten::_fused_dropout"};
  return names.count(name.name) != 0;
}

// While alive, the CPU's default generator draws the numbers of simulated GPU `device`'s
// generator: what a random operator on cuda:N draws, the operators its CPU kernel calls
// included, comes from cuda:N's generator at its offset (seeded by torch.cuda.manual_seed,
// read by torch.cuda.get_rng_state; NOTE [A simulated GPU's generator]), which then moves
// on, and the CPU's own sequence is left where it was.
class DeviceDraws {
 public:
  explicit DeviceDraws(c10::Device device)
      : serial_(mutex()),
        cpu_(at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator())),
        device_(
            at::check_generator<DeviceGenerator>(at::globalContext().defaultGenerator(device))) {
    State drawn;
    {
      std::lock_guard lock(device_->mutex_);
      drawn = take(device_);
    }
    std::lock_guard lock(cpu_->mutex_);
    saved_ = take(cpu_);
    put(cpu_, drawn);
  }
  ~DeviceDraws() {
    {
      std::lock_guard lock(cpu_->mutex_);
      put(cpu_, saved_);
    }
    std::lock_guard lock(device_->mutex_);
    device_->advance();
  }
  DeviceDraws(const DeviceDraws&) = delete;
  DeviceDraws& operator=(const DeviceDraws&) = delete;

 private:
  struct State {
    at::mt19937 engine;
    std::optional<float> next_float;
    std::optional<double> next_double;
  };
  static State take(at::CPUGeneratorImpl* g) {
    return {g->engine(), g->next_float_normal_sample(), g->next_double_normal_sample()};
  }
  static void put(at::CPUGeneratorImpl* g, const State& s) {
    g->set_engine(s.engine);
    g->set_next_float_normal_sample(s.next_float);
    g->set_next_double_normal_sample(s.next_double);
  }
  static std::mutex& mutex() {
    static std::mutex serial;  // one device's draws at a time
    return serial;
  }

  std::lock_guard<std::mutex> serial_;
  at::CPUGeneratorImpl* cpu_;
  DeviceGenerator* device_;
  State saved_;
};

bool is_optional_generator(const c10::Argument& argument) {
  const c10::TypePtr& type = argument.type();
  if (type->kind() != c10::TypeKind::OptionalType) return false;
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
         c10::TypeKind::GeneratorType;
}

// One call of run_on_cpu: the stack rewritten for the CPU, and what to give back.
class Call {
 public:
  // `cpu`: the key of the kernel to run, the CPU's or (for sparse tensors) SparseCPU's.
  Call(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey cpu)
      : op_(op),
        stack_(*stack),
        cpu_(cpu),
        host_ok_(takes_host_tensors(op.operator_name())),
        peer_copy_(copies_between_devices(op.operator_name())) {}

  void run() {
    const auto& arguments = op_.schema().arguments();
    const std::size_t first = stack_.size() - arguments.size();
    for (std::size_t i = 0; i < arguments.size(); ++i) take(stack_[first + i], arguments[i]);
    std::optional<DeviceDraws> draws;
    if ((generator_given_none_ || draws_without_a_generator(op_.operator_name())) &&
        out_device().is_cuda()) {
      draws.emplace(out_device());
    }
    {
      memory::DeviceScope scope(out_device().is_cuda() ? out_device().index() : -1);
      const std::optional<c10::ScalarType> cast_back = half_to_float(first);
      op_.redispatchBoxed(c10::DispatchKeySet(cpu_), &stack_);
      if (cast_back) stack_.back() = stack_.back().toTensor().to(*cast_back);
    }
    draws.reset();
    const std::size_t returned = op_.schema().returns().size();
    for (std::size_t j = stack_.size() - returned; j < stack_.size(); ++j) give_back(stack_[j]);
    carry_metadata();
  }

 private:
  // CUDA's softmax takes a half input to a float output (half_to_float, as autocast's
  // softmax in float32 asks), and its backward a float gradient to a half one; the CPU's
  // kernels refuse both. The input goes to float first, and the backward's result back to
  // the input's dtype (returned: the dtype to cast the result to).
  std::optional<c10::ScalarType> half_to_float(std::size_t first) {
    const std::string& name = op_.operator_name().name;
    if (!op_.operator_name().overload_name.empty()) return std::nullopt;
    if (name == "aten::_softmax" || name == "aten::_log_softmax") {
      if (!stack_[first + 2].toBool()) return std::nullopt;
      stack_[first] = stack_[first].toTensor().to(at::kFloat);
      stack_[first + 2] = false;
    } else if (name == "aten::_softmax_backward_data" ||
               name == "aten::_log_softmax_backward_data") {
      const c10::ScalarType grad = stack_[first].toTensor().scalar_type();
      const auto input = static_cast<c10::ScalarType>(stack_[first + 3].toInt());
      if (grad == input) return std::nullopt;
      stack_[first + 3] = static_cast<int64_t>(grad);
      return input;
    }
    return std::nullopt;
  }

  c10::Device out_device() const {
    if (target_) return *target_;
    if (device_) return *device_;
    return {c10::DeviceType::CUDA, current_device()};
  }

  void take(c10::IValue& value, const c10::Argument& argument) {
    if (value.isTensor()) {
      value = take_tensor(value.toTensor(), argument);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> list = value.toTensorList();
      c10::List<at::Tensor> views;
      views.reserve(list.size());
      for (const at::Tensor& t : list) views.push_back(take_tensor(t, argument));
      value = std::move(views);
    } else if (value.isList()) {  // Tensor?[]
      c10::List<c10::IValue> list = value.toList();
      if (list.empty() || !(list.get(0).isTensor() || list.get(0).isNone())) return;
      c10::impl::GenericList views(list.elementType());
      for (const c10::IValue& e : list)
        views.push_back(e.isTensor() ? c10::IValue(take_tensor(e.toTensor(), argument)) : e);
      value = std::move(views);
    } else if (value.isDevice()) {
      c10::Device device = value.toDevice();
      if (device.is_cuda()) {
        if (!device.has_index()) device = {c10::DeviceType::CUDA, current_device()};
        check_ordinal(device.index());
        value = c10::Device(c10::DeviceType::CPU);
      }
      target_ = device;
    } else if (value.isNone() && is_optional_generator(argument)) {
      generator_given_none_ = true;
    }
  }

  at::Tensor take_tensor(const at::Tensor& t, const c10::Argument& argument) {
    if (!t.defined()) return t;
    const c10::Device device = t.device();
    if (device.is_cuda()) {
      if (t.layout() != c10::kStrided && t.layout() != c10::kSparse) not_strided(op_, t);
      check_device(device, argument);
      at::Tensor view = t.is_sparse() ? sparse_cpu_view(t) : cpu_view(t);
      views_.emplace_back(view, t);
      return view;
    }
    // A CPU scalar (0-dim) is a number to CUDA's kernels; a CPU tensor is not.
    if (!host_ok_ && t.dim() > 0) check_device(device, argument);
    if (t.layout() == c10::kStrided) hosts_.push_back(t.storage().unsafeGetStorageImpl());
    return t;
  }

  void check_device(c10::Device device, const c10::Argument& argument) {
    if (peer_copy_) {  // between GPUs as between a GPU and the host; the first is the target
      if (!device_) device_ = device;
      return;
    }
    if (!common_) {
      common_ = device;
    } else if (*common_ != device) {
      TORCH_CHECK_INDEX(!indexes(op_.operator_name()),
                        "indices should be either on cpu or on the same device as the indexed "
                        "tensor (",
                        *common_, ")");
      devices_differ(*common_, device, op_, argument.name());
    }
    if (device.is_cuda()) device_ = device;
  }

  void give_back(c10::IValue& value) {
    if (value.isTensor()) {
      value = back(value.toTensor());
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> list = value.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(back(t));
      value = std::move(out);
    }
  }

  at::Tensor back(const at::Tensor& t) {
    if (!t.defined()) return t;
    for (const auto& [view, original] : views_) {
      if (view.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return original;
    }
    const c10::Device device = out_device();
    if (!device.is_cuda()) return t;
    if (t.is_sparse()) return sparse_as_cuda(t, device);
    if (t.layout() != c10::kStrided) not_strided(op_, t);
    for (const c10::StorageImpl* host : hosts_) {  // a host argument handed back as it is
      if (t.storage().unsafeGetStorageImpl() == host) return t;
    }
    return as_cuda(t, device);
  }

  // What the CPU kernel changed of a cuda argument's TensorImpl (resize_, set_, out=),
  // onto the argument itself. (TensorImpl::set_storage_keep_dtype would take the storage's
  // device, the CPU's: the metadata comes over from a cuda tensor instead.)
  void carry_metadata() {
    for (auto& [view, original] : views_) {
      if (original.is_sparse()) {
        if (!sparse_unchanged(view, original)) {
          set_sparse_on(at::sparse::get_sparse_impl(original), *at::sparse::get_sparse_impl(view),
                        original.device());
        }
        continue;
      }
      const c10::TensorImpl* from = view.unsafeGetTensorImpl();
      c10::TensorImpl* to = original.unsafeGetTensorImpl();
      const bool same_storage = from->storage().is_alias_of(to->storage());
      claim(from->storage().unsafeGetStorageImpl(), original.device());
      if (same_storage && from->sizes() == to->sizes() && from->strides() == to->strides() &&
          from->storage_offset() == to->storage_offset()) {
        continue;
      }
      to->shallow_copy_from(as_cuda(view, original.device()).getIntrusivePtr());
    }
  }

  const c10::OperatorHandle& op_;
  torch::jit::Stack& stack_;
  const c10::DispatchKey cpu_;
  const bool host_ok_;
  const bool peer_copy_;
  std::optional<c10::Device> common_;  // the first tensor's device, as CUDA's checks keep it
  std::optional<c10::Device> device_;  // the cuda device of the tensors
  std::optional<c10::Device> target_;  // a device argument (a factory's, or _to_copy's)
  bool generator_given_none_ = false;  // a random operator, to draw from the device's
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> views_;  // CPU view, cuda original
  c10::SmallVector<const c10::StorageImpl*, 2> hosts_;
};

void run_on_cpu(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  Call(op, stack, c10::DispatchKey::CPU).run();
}

void run_on_sparse_cpu(const c10::OperatorHandle& op, c10::DispatchKeySet,
                       torch::jit::Stack* stack) {
  Call(op, stack, c10::DispatchKey::SparseCPU).run();
}

// An operator with a CUDA kernel and no CPU one: custom kernels, cuDNN, flash attention,
// cuSPARSE's.
void not_simulated(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  refuse("sgpu: " + op.schema().name() +
         " has a CUDA kernel and no CPU one, so it cannot run on simulated GPUs (CUDA on sim "
         "runs each operator's CPU kernel). Run this code on the cuda backend (a GPU node), or "
         "keep this operator out of what runs on sim");
}

void throw_not_implemented(const std::string& message) {
  C10_THROW_ERROR(NotImplementedError, message);
}

std::atomic<Refusal> g_refusal{&throw_not_implemented};

// Streams are names on sim: there is nothing to keep alive for one.
void nothing(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*) {}

// Scaled-dot-product attention's choice of kernel for a cuda query: the math one, which
// is made of operators that run on CPU kernels (flash and memory-efficient attention are
// CUDA kernels only).
int64_t math_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const std::optional<at::Tensor>&, double, bool, std::optional<double>,
                       bool) {
  return static_cast<int64_t>(at::SDPBackend::math);
}

bool skipped_namespace(const std::string& ns) {
  // Collectives go to the process group of the tensors' device, which takes cuda tensors
  // (sim/cuda/groups.cc); the profiler's operators have no tensors.
  static const std::set<std::string> names = {
      "c10d",     "_c10d_functional", "c10d_functional", "_c10d_functional_autograd",
      "_dtensor", "profiler"};
  return names.count(ns) != 0;
}

}  // namespace

at::Tensor cpu_view(const at::Tensor& cuda) {
  const c10::TensorImpl& from = *cuda.unsafeGetTensorImpl();
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(from.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU), from.dtype());
  impl->set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
  return at::Tensor(std::move(impl));
}

int device_of(const c10::Storage& storage) { return memory::cuda_device_of(storage.allocator()); }

void set_refusal(Refusal refusal) { g_refusal.store(refusal); }

void refuse(const std::string& message) {
  g_refusal.load()(message);
  C10_THROW_ERROR(NotImplementedError, message);  // a refusal that returned
}

namespace {

// The library that registers namespace `ns`'s kernels for `key`: made once, and kept, as a
// library's registrations last as long as it does. Under cover_operators()'s lock.
torch::Library& library_for(const std::string& ns, c10::DispatchKey key) {
  static std::map<std::pair<std::string, c10::DispatchKey>, torch::Library*> libraries;
  torch::Library*& library = libraries[{ns, key}];
  if (library == nullptr)
    library = new torch::Library(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  return *library;
}

// Registers sim's CUDA kernel for operator `op`, `qualified` its name in namespace `ns`:
// its CPU kernel's, sim's own (the RNN cells), or a refusal. False where it has no kernel
// for either.
bool cover_dense(const c10::OperatorHandle& op, const std::string& ns,
                 const std::string& qualified) {
  const bool cpu =
      op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
  const bool cuda = op.hasKernelForDispatchKey(c10::DispatchKey::CUDA);
  if (!cpu && !cuda) return false;
  torch::Library& library = library_for(ns, c10::DispatchKey::CUDA);
  if (op.schema().name() == "aten::record_stream") {
    library.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&nothing>());
  } else if (cpu) {
    library.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_on_cpu>());
  } else if (!cover_rnn_cell(library, op.schema().name())) {
    library.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&not_simulated>());
  }
  return true;
}

// The same for its SparseCUDA kernel: its SparseCPU kernel's, or a refusal (cuSPARSE's).
bool cover_sparse(const c10::OperatorHandle& op, const std::string& ns,
                  const std::string& qualified) {
  const bool cpu = op.hasKernelForDispatchKey(c10::DispatchKey::SparseCPU);
  if (!cpu && !op.hasKernelForDispatchKey(c10::DispatchKey::SparseCUDA)) return false;
  torch::Library& library = library_for(ns, c10::DispatchKey::SparseCUDA);
  if (cpu) {
    library.impl(qualified.c_str(),
                 torch::CppFunction::makeFromBoxedFunction<&run_on_sparse_cpu>());
  } else {
    library.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&not_simulated>());
  }
  return true;
}

}  // namespace

int cover_operators() {
  static std::mutex mutex;
  static std::set<std::string> covered;  // "name.overload"
  std::lock_guard lock(mutex);
  at::native::_fused_sdp_choice_stub.set_cuda_dispatch_ptr(&math_attention);
  // Replacing a kernel is worth a warning each time to torch; here it is the point.
  struct Quiet final : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard silence(&quiet);
  auto& dispatcher = c10::Dispatcher::singleton();
  int count = 0;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const std::string key = name.name + "." + name.overload_name;
    if (covered.count(key) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    const std::string ns = name.name.substr(0, name.name.find("::"));
    if (skipped_namespace(ns)) continue;
    std::string qualified = name.name.substr(ns.size() + 2);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    const bool dense = cover_dense(*op, ns, qualified);
    const bool sparse = cover_sparse(*op, ns, qualified);
    if (!dense && !sparse) continue;
    covered.insert(key);
    ++count;
  }
  return count;
}

}  // namespace sgpu::sim::cuda
