// A simulated transport's groups for cuda tensors on sim (NOTE [CUDA on sim]).
//
// At a group's first collective on cuda tensors its ranks compare their GPUs, and two ranks
// on one GPU of a node fail as NCCL fails them ("Duplicate GPU detected"): the placement bug
// of a rank that never called torch.cuda.set_device(LOCAL_RANK) and put everything on
// cuda:0, which runs on one CPU just as well.
//
// A transport that takes only CPU tensors (Gloo) runs each collective on CPU views of its
// tensors' storage, and its Work hands back the cuda tensors it was given, in its result and
// its future, so a caller (the DDP reducer, a comm hook) never meets a view.
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "contract/rank_env.h"
#include "sim/cuda/parts.h"
#include "sim/cuda/sim_cuda.h"

namespace sgpu::sim::cuda {
namespace {

// The views a collective ran on, each with the cuda tensor it stands for.
using Pairs = std::vector<std::pair<at::Tensor, at::Tensor>>;

std::vector<at::Tensor> originals(const std::vector<at::Tensor>& tensors, const Pairs& pairs) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    at::Tensor original = t;
    for (const auto& [view, cuda] : pairs) {
      if (view.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) original = cuda;
    }
    out.push_back(std::move(original));
  }
  return out;
}

// Whose GPU is whose, agreed once per group: each rank's (node, device) through the
// group's store, under a generation of its own (a group made again under the same name
// meets in the same store; every member makes each one once).
class GpuCheck {
 public:
  GpuCheck(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
      : store_(std::move(store)), rank_(rank), size_(size) {}

  void check(c10::Device device) {
    std::lock_guard lock(mutex_);
    if (checked_) return;
    checked_ = true;
    const int node = contract::read_rank_environment().node_rank;
    const std::int64_t joined = store_->add("sgpu/cuda/gpus/joined", 1);
    const std::string prefix = "sgpu/cuda/gpus/" + std::to_string((joined - 1) / size_) + "/";
    const std::string mine = std::to_string(node) + ":" + std::to_string(device.index());
    store_->set(prefix + std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int other = 0; other < size_; ++other) {
      if (other == rank_) continue;
      const std::vector<uint8_t> theirs = store_->get(prefix + std::to_string(other));
      if (std::string(theirs.begin(), theirs.end()) != mine) continue;
      C10_THROW_ERROR(
          DistBackendError,
          "NCCL error (simulated by sgpu): invalid usage: Duplicate GPU detected : rank " +
              std::to_string(rank_) + " and rank " + std::to_string(other) +
              " both on CUDA device " + std::to_string(device.index()) +
              ". Each rank of a group needs a GPU of its own: call "
              "torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) first, and put the "
              "rank's tensors on cuda:LOCAL_RANK (or plain \"cuda\")");
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int size_;
  std::mutex mutex_;
  bool checked_ = false;
};

// One collective's tensors, as the inner transport takes them.
class Taken {
 public:
  Taken(GpuCheck& check, bool views) : check_(check), views_(views) {}

  at::Tensor operator()(const at::Tensor& t) {
    if (!t.defined() || !t.is_cuda()) return t;
    check_.check(t.device());
    if (!views_) return t;
    at::Tensor view = cpu_view(t);
    pairs_->emplace_back(view, t);
    return view;
  }
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const at::Tensor& t : tensors) out.push_back((*this)(t));
    return out;
  }
  std::vector<std::vector<at::Tensor>> operator()(
      const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(lists.size());
    for (const auto& list : lists) out.push_back((*this)(list));
    return out;
  }
  std::shared_ptr<Pairs> pairs() const { return pairs_; }

 private:
  GpuCheck& check_;
  const bool views_;
  std::shared_ptr<Pairs> pairs_ = std::make_shared<Pairs>();
};

class ViewWork final : public c10d::Work {
 public:
  ViewWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<const Pairs> pairs)
      : c10d::Work(-1, inner->retrieveOpType()),
        inner_(std::move(inner)),
        pairs_(std::move(pairs)) {}

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return originals(inner_->result(), *pairs_); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override { return inner_->wait(timeout); }
  void abort() override { inner_->abort(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto pairs = pairs_;
    return inner_->getFuture()->then(
        [pairs](c10::ivalue::Future& done) -> c10::IValue {
          const c10::IValue& value = done.value();
          if (!value.isTensorList()) return value;
          return originals(value.toTensorVector(), *pairs);
        },
        c10::ListType::ofTensors());
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<const Pairs> pairs_;
};

class CudaGroup final : public c10d::Backend {
 public:
  CudaGroup(c10::intrusive_ptr<c10d::Backend> inner, c10::intrusive_ptr<c10d::Store> store,
            bool views)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        check_(std::move(store), getRank(), getSize()),
        views_(views) {}

  const std::string getBackendName() const override { return inner_->getBackendName(); }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return on_views([&](Taken& take) {
      auto v = take(tensors);
      return inner_->broadcast(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return on_views([&](Taken& take) {
      auto v = take(tensors);
      return inner_->allreduce(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return on_views([&](Taken& take) {
      auto v = take(tensors);
      return inner_->allreduce_coalesced(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    return on_views([&](Taken& take) {
      auto v = take(tensors);
      return inner_->reduce(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->allgather(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(output);
      auto in = take(input);
      return inner_->_allgather_base(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->allgather_coalesced(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->allgather_into_tensor_coalesced(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->reduce_scatter(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(output);
      auto in = take(input);
      return inner_->_reduce_scatter_base(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->reduce_scatter_tensor_coalesced(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(output);
      auto in = take(input);
      return inner_->alltoall_base(out, in, output_splits, input_splits, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->alltoall(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return inner_->barrier(opts);
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->gather(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return on_views([&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->scatter(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return on_views([&](Taken& take) {
      auto v = take(tensors);
      return inner_->send(v, dst, tag);
    });
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return on_views([&](Taken& take) {
      auto v = take(tensors);
      return inner_->recv(v, src, tag);
    });
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return on_views([&](Taken& take) {
      auto v = take(tensors);
      return inner_->recvAnysource(v, tag);
    });
  }

 private:
  template <typename Run>
  c10::intrusive_ptr<c10d::Work> on_views(Run run) {
    Taken taken(check_, views_);
    c10::intrusive_ptr<c10d::Work> work = run(taken);
    if (taken.pairs()->empty()) return work;
    return c10::make_intrusive<ViewWork>(std::move(work), taken.pairs());
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  GpuCheck check_;
  const bool views_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> for_cuda_tensors(c10::intrusive_ptr<c10d::Backend> group,
                                                   c10::intrusive_ptr<c10d::Store> store,
                                                   bool cpu_views) {
  return c10::make_intrusive<CudaGroup>(std::move(group), std::move(store), cpu_views);
}

}  // namespace sgpu::sim::cuda
