#include "sgpu/parallel/fsdp.h"

#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>

#include "sgpu/errors.h"

namespace sgpu::parallel::detail {
namespace {

constexpr std::size_t kMaxReduceScattersInFlight = 2;

// Tells the engine that backward accumulated a parameter's gradient.
class UnitGradHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  UnitGradHook(FsdpEngine* engine, int unit) : engine_(engine), unit_(unit) {}
  void operator()(const torch::autograd::Variable&) override { engine_->grad_accumulated(unit_); }

 private:
  FsdpEngine* engine_;
  int unit_;
};

// The units to shard: the ones given, else the root's children that hold parameters;
// then the root itself, for what no other unit holds.
std::vector<const torch::nn::Module*> units_of(
    const torch::nn::Module& root, const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  std::vector<const torch::nn::Module*> list;
  if (units.empty()) {
    for (const auto& child : root.children()) {
      if (!child->parameters().empty()) list.push_back(child.get());
    }
  } else {
    for (const auto& unit : units) list.push_back(unit.get());
  }
  list.push_back(&root);
  return list;
}

// `module`'s parameters that no earlier unit took, in the root's order (`named`), laid out
// in `unit`'s flat buffer; they must share dtype and device.
std::vector<at::Tensor> take_parameters(const torch::nn::Module& module,
                                        const torch::OrderedDict<std::string, at::Tensor>& named,
                                        std::unordered_set<const c10::TensorImpl*>& taken,
                                        UnitShard& unit) {
  std::unordered_set<const c10::TensorImpl*> mine;
  for (const auto& p : module.parameters()) mine.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> tensors;
  for (const auto& item : named) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    if (!mine.count(impl) || taken.count(impl)) continue;
    taken.insert(impl);
    const at::Tensor& p = item.value();
    if (!tensors.empty() &&
        (p.scalar_type() != tensors[0].scalar_type() || p.device() != tensors[0].device())) {
      throw Error("sgpu FullyShardedDataParallel: parameter '" + item.key() + "' is " +
                  std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() +
                  " but '" + unit.params[0].name + "' of the same unit is " +
                  std::string(c10::toString(tensors[0].scalar_type())) + " on " +
                  tensors[0].device().str() +
                  "; a unit's parameters must share dtype and device (make them units of "
                  "their own)");
    }
    unit.params.push_back({item.key(), p.sizes().vec(), unit.flat_numel, p.numel()});
    unit.flat_numel += p.numel();
    tensors.push_back(p);
  }
  return tensors;
}

}  // namespace

FsdpEngine::FsdpEngine(torch::nn::Module& root,
                       const std::vector<std::shared_ptr<torch::nn::Module>>& units,
                       FsdpOptions options, c10::intrusive_ptr<c10d::ProcessGroup> group)
    : root_(root), group_(std::move(group)) {
  const std::int64_t world = group_->getSize();
  const std::int64_t rank = group_->getRank();
  const auto named = root_.named_parameters();
  if (options.sync_module_states) {
    std::vector<at::Tensor> state = root_.parameters();
    for (const auto& buffer : root_.buffers()) state.push_back(buffer);
    broadcast_from_rank0(group_, state);
  }

  std::unordered_set<const c10::TensorImpl*> taken;
  for (const torch::nn::Module* module : units_of(root_, units)) {
    UnitShard unit;
    std::vector<at::Tensor> tensors = take_parameters(*module, named, taken, unit);
    if (tensors.empty()) {
      if (module != &root_ && !units.empty()) {
        throw Error(
            "sgpu FullyShardedDataParallel: a unit given holds no parameter of the "
            "wrapped module that another unit does not already hold; units must be "
            "submodules of the wrapped module");
      }
      continue;
    }
    unit.padded_numel = padded_to(unit.flat_numel, world);
    const std::int64_t shard_numel = unit.padded_numel / world;
    unit.shard_offset = rank * shard_numel;
    {
      torch::NoGradGuard no_grad;
      at::Tensor flat = flatten_padded(tensors, unit.padded_numel);
      unit.data = flat.narrow(0, unit.shard_offset, shard_numel).clone();
      // From here on the module's parameters view the unit's gathered buffer, whose
      // storage is released and filled again in place (see free and gather).
      for (size_t i = 0; i < tensors.size(); ++i) {
        const FlatParamInfo& info = unit.params[i];
        tensors[i].set_data(flat.narrow(0, info.offset, info.numel).view(info.shape));
      }
      full_.push_back(flat);
    }
    unit.data.set_requires_grad(true);
    units_.push_back(std::move(unit));
    module_params_.push_back(std::move(tensors));
    unit_modules_.push_back(module);
    gathered_.push_back(true);
  }
  accumulated_.assign(units_.size(), 0);
  reduced_.assign(units_.size(), false);
  for (size_t u = 0; u < module_params_.size(); ++u) {
    for (const at::Tensor& p : module_params_[u]) {
      torch::autograd::impl::set_post_acc_grad_hooks(
          p, std::make_unique<UnitGradHook>(this, static_cast<int>(u)));
    }
  }
  free_all();
}

FsdpEngine::~FsdpEngine() {
  for (const auto& params : module_params_) {
    for (const at::Tensor& p : params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

std::vector<int> FsdpEngine::units_in(const torch::nn::Module& module, bool children) const {
  std::unordered_set<const torch::nn::Module*> scope{&module};
  if (children) {
    for (const auto& m : module.modules(/*include_self=*/false)) scope.insert(m.get());
  }
  std::vector<int> out;
  for (size_t i = 0; i < unit_modules_.size(); ++i) {
    if (scope.count(unit_modules_[i]) && (children || unit_modules_[i] == &module)) {
      out.push_back(static_cast<int>(i));
    }
  }
  return out;
}

// The gathered buffer's storage is released and allocated again in place, never replaced:
// the module's parameters and the tensors autograd saved in forward view it, so what
// backward reads is what gather() put back.
void FsdpEngine::gather(int index) {
  if (gathered_[index]) return;
  c10::StorageImpl* storage = full_[index].storage().unsafeGetStorageImpl();
  const std::size_t bytes =
      static_cast<std::size_t>(full_[index].numel()) * full_[index].element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  at::Tensor shard = units_[index].data.detach();
  group_->_allgather_base(full_[index], shard)->wait();
  gathered_[index] = true;
}

void FsdpEngine::gather_all() {
  for (size_t i = 0; i < units_.size(); ++i) gather(static_cast<int>(i));
}

void FsdpEngine::free(int index) {
  if (!gathered_[index]) return;
  c10::StorageImpl* storage = full_[index].storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  gathered_[index] = false;
}

void FsdpEngine::after_unit_forward(const std::vector<int>& units, at::Tensor& output) {
  if (units.empty()) return;
  if (output.requires_grad()) {
    // Gathered again just before backward reaches these units.
    output.register_hook([this, units](const at::Tensor&) {
      for (const int unit : units) gather(unit);
    });
  }
  for (const int unit : units) free(unit);
}

void FsdpEngine::free_all() {
  for (size_t i = 0; i < units_.size(); ++i) free(static_cast<int>(i));
}

void FsdpEngine::expect_backward(at::Tensor& output) {
  if (!output.requires_grad()) {
    free_all();
    return;
  }
  output.register_hook([this](const at::Tensor&) {
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  });
}

void FsdpEngine::grad_accumulated(int unit) {
  if (reduced_[unit] || ++accumulated_[unit] < module_params_[unit].size()) return;
  reduce_unit(unit);
}

void FsdpEngine::reduce_unit(int index) {
  UnitShard& unit = units_[index];
  // The unit's parameters lie end to end in its flat buffer, in the order of params.
  at::Tensor flat = take_grads_flat(module_params_[index], unit.padded_numel, unit.data.options());
  at::Tensor output = at::empty({unit.padded_numel / group_->getSize()}, flat.options());
  c10::intrusive_ptr<c10d::Work> work = group_->_reduce_scatter_base(output, flat);
  in_flight_.push_back({index, flat, output, std::move(work)});
  reduced_[index] = true;
  free(index);  // backward is done with the unit's parameters
  while (in_flight_.size() > kMaxReduceScattersInFlight) settle_oldest();
}

void FsdpEngine::settle_oldest() {
  InFlight done = std::move(in_flight_.front());
  in_flight_.pop_front();
  done.work->wait();
  at::Tensor grad = done.output.div_(static_cast<double>(group_->getSize()));
  accumulate_grad(units_[done.unit].data, grad);
}

// Every rank issues the same reduce-scatters in the same order: backward visits the same
// graph on every rank, and the units left for here go in unit order.
void FsdpEngine::finish_backward() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (gathered_[u] && !reduced_[u]) reduce_unit(static_cast<int>(u));
  }
  while (!in_flight_.empty()) settle_oldest();
  accumulated_.assign(units_.size(), 0);
  reduced_.assign(units_.size(), false);
  free_all();
}

std::vector<at::Tensor> FsdpEngine::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& unit : units_) out.push_back(unit.data);
  return out;
}

ShardedState FsdpEngine::sharded_state(const torch::nn::Module& root,
                                       torch::optim::Optimizer* optimizer) {
  ShardedState state;
  state.strategy = "fsdp";
  state.optimizer = optimizer;
  for (const auto& unit : units_) {
    state.model.push_back({unit.params, unit.shard_offset, unit.data, false});
  }
  if (optimizer != nullptr) state.optimized = state.model;
  add_replicated_buffers(root, state);
  return state;
}

StateDict FsdpEngine::full_state_dict(bool rank0_only) {
  const bool keep = !rank0_only || group_->getRank() == 0;
  StateDict out;
  for (auto& unit : units_) {
    at::Tensor full = at::empty({unit.padded_numel}, unit.data.options().requires_grad(false));
    at::Tensor shard = unit.data.detach();
    group_->_allgather_base(full, shard)->wait();
    if (!keep) continue;
    for (const auto& info : unit.params) {
      out[info.name] = full.narrow(0, info.offset, info.numel).view(info.shape).clone();
    }
  }
  if (keep) {
    for (const auto& item : root_.named_buffers()) out[item.key()] = item.value().detach().clone();
  }
  return out;
}

void FsdpEngine::load_full_state_dict(const StateDict& state) {
  torch::NoGradGuard no_grad;
  std::unordered_set<std::string> known;
  for (const auto& unit : units_) {
    for (const auto& info : unit.params) known.insert(info.name);
  }
  for (const auto& item : root_.named_buffers()) known.insert(item.key());
  for (const auto& [name, tensor] : state) {
    if (!known.count(name)) {
      throw Error("sgpu FullyShardedDataParallel: the state to load has a tensor '" + name +
                  "' that the model has no parameter or buffer for");
    }
  }
  // Every tensor is checked before any is loaded.
  std::vector<at::Tensor> flats;
  for (auto& unit : units_) {
    at::Tensor flat = at::zeros({unit.padded_numel}, unit.data.options().requires_grad(false));
    for (const auto& info : unit.params) {
      const auto found = state.find(info.name);
      if (found == state.end()) {
        throw Error("sgpu FullyShardedDataParallel: the state to load has no tensor '" + info.name +
                    "', which the model has (shape " + c10::str(c10::IntArrayRef(info.shape)) +
                    ")");
      }
      const at::Tensor& t = found->second;
      if (t.sizes().vec() != info.shape) {
        throw Error("sgpu FullyShardedDataParallel: tensor '" + info.name + "' to load has shape " +
                    c10::str(t.sizes()) + " but the model's has " +
                    c10::str(c10::IntArrayRef(info.shape)));
      }
      if (t.scalar_type() != unit.data.scalar_type()) {
        throw Error("sgpu FullyShardedDataParallel: tensor '" + info.name + "' to load is " +
                    std::string(c10::toString(t.scalar_type())) + " but the model's is " +
                    std::string(c10::toString(unit.data.scalar_type())));
      }
      flat.narrow(0, info.offset, info.numel).copy_(t.reshape(-1));
    }
    flats.push_back(flat);
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].data.copy_(flats[u].narrow(0, units_[u].shard_offset, units_[u].data.numel()));
  }
  for (auto& item : root_.named_buffers()) {
    const auto found = state.find(item.key());
    if (found == state.end()) continue;
    item.value().copy_(found->second);
  }
}

}  // namespace sgpu::parallel::detail
