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
//
// Torch's "nccl" group (NcclRules) refuses what torch's ProcessGroupNCCL refuses, with its
// words and exception types, and runs what NCCL runs that the transport beneath has not:
// PREMUL_SUM is NCCL's own definition (each rank's input times the factor, then a sum), and
// a reduction of float8 tensors is made in float32 and rounded once.
#include <ATen/ThreadLocalState.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <utility>
#include <vector>

#include "collectives/interposer.h"
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

// What torch's ProcessGroupNCCL refuses, as it says it.
namespace nccl_rules {

void check_dtype(const at::Tensor& t) {
  static const std::set<c10::ScalarType> taken = {c10::kChar,
                                                  c10::kByte,
                                                  c10::kFloat,
                                                  c10::kDouble,
                                                  c10::kInt,
                                                  c10::kLong,
                                                  c10::kHalf,
                                                  c10::kBool,
                                                  c10::kBFloat16,
                                                  c10::ScalarType::Float8_e5m2,
                                                  c10::ScalarType::Float8_e4m3fn,
                                                  c10::ScalarType::Float8_e4m3fnuz,
                                                  c10::ScalarType::Float8_e5m2fnuz};
  TORCH_CHECK_WITH(
      TypeError, taken.count(t.scalar_type()) != 0,
      "Input tensor data type is not supported for NCCL process group: ", t.scalar_type());
}

void check_contiguous(const at::Tensor& t) {
  if (!t.is_contiguous(t.suggest_memory_format())) {
    C10_THROW_ERROR(ValueError, "Tensors must be contiguous");
  }
}

void check_op(const c10d::ReduceOp& op, const std::vector<at::Tensor>& tensors) {
  switch (op.op_) {
    case c10d::ReduceOp::BAND:
      C10_THROW_ERROR(ValueError, "Cannot use ReduceOp.BAND with NCCL");
    case c10d::ReduceOp::BOR:
      C10_THROW_ERROR(ValueError, "Cannot use ReduceOp.BOR with NCCL");
    case c10d::ReduceOp::BXOR:
      C10_THROW_ERROR(ValueError, "Cannot use ReduceOp.BXOR with NCCL");
    case c10d::ReduceOp::AVG:
      for (const at::Tensor& t : tensors) {
        TORCH_CHECK_WITH(TypeError, t.scalar_type() != c10::kBool,
                         "Cannot use ReduceOp.AVG with boolean inputs");
      }
      return;
    case c10d::ReduceOp::PREMUL_SUM:
      for (const at::Tensor& t : tensors) {
        const c10::ScalarType type = t.scalar_type();
        TORCH_CHECK_WITH(TypeError,
                         type == c10::kHalf || type == c10::kFloat || type == c10::kBFloat16 ||
                             type == c10::kDouble,
                         "PreMulSum Data type must be half, float, bfloat16 or double");
      }
      return;
    default:
      return;
  }
}

// PREMUL_SUM's factor, as the op carries it (a number, or a one-element tensor).
at::Tensor scaled(const at::Tensor& t, const c10d::ReduceOp& op) {
  const auto* factor = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(factor != nullptr, "ReduceOp.PREMUL_SUM without its factor");
  if (factor->tensor_factor.defined()) return t * factor->tensor_factor.to(t.device());
  return t * factor->double_factor;
}

// Whether a reduction must run on stand-ins of its tensors: what the transport beneath
// cannot reduce as NCCL does.
bool needs_stand_ins(const c10d::ReduceOp& op, const std::vector<at::Tensor>& tensors) {
  if (op == c10d::ReduceOp::PREMUL_SUM) return true;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && c10::isFloat8Type(t.scalar_type())) return true;
  }
  return false;
}

// What the transport reduces for `t`: float32 for float8, times the factor for PREMUL_SUM
// (for an input; an output only receives), never `t` itself.
at::Tensor stand_in(const at::Tensor& t, const c10d::ReduceOp& op, bool input) {
  at::Tensor wide = c10::isFloat8Type(t.scalar_type()) ? t.to(c10::kFloat) : t.clone();
  return input && op == c10d::ReduceOp::PREMUL_SUM ? scaled(wide, op) : wide;
}

std::vector<at::Tensor> stand_ins(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                                  bool input) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) out.push_back(stand_in(t, op, input));
  return out;
}

// The op the transport runs on stand-ins: a sum for PREMUL_SUM, whose factor they hold.
c10d::ReduceOp on_stand_ins(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::PREMUL_SUM ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
}

// The stand-ins' results into the tensors they stand for, once `work` is done.
c10::intrusive_ptr<c10d::Work> rounded_into(c10::intrusive_ptr<c10d::Work> work,
                                            std::vector<at::Tensor>& targets,
                                            const std::vector<at::Tensor>& results) {
  work->wait();
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i].copy_(results[i]);
  return work;
}

// A reduction of `tensors` in place (all_reduce, reduce) made on stand-ins by `reduction`
// (the group's own method, given the stand-ins and the op they take), their results
// rounded back into `tensors` where `writes_here` (NCCL's reduce writes the root's only).
template <typename Options, typename Reduction>
c10::intrusive_ptr<c10d::Work> in_place(std::vector<at::Tensor>& tensors, const Options& opts,
                                        bool writes_here, Reduction reduction) {
  std::vector<at::Tensor> wide = stand_ins(tensors, opts.reduceOp, true);
  Options sum = opts;
  sum.reduceOp = on_stand_ins(opts.reduceOp);
  c10::intrusive_ptr<c10d::Work> work = reduction(wide, sum);
  if (!writes_here) return work;
  return rounded_into(std::move(work), tensors, wide);
}

}  // namespace nccl_rules

// One collective's tensors, as the inner transport takes them.
class Taken {
 public:
  Taken(GpuCheck& check, bool views, bool nccl) : check_(check), views_(views), nccl_(nccl) {}

  at::Tensor operator()(const at::Tensor& t) {
    if (nccl_ && t.defined()) {
      nccl_rules::check_dtype(t);
      nccl_rules::check_contiguous(t);
    }
    return taken(t);
  }
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const at::Tensor& t : tensors) out.push_back((*this)(t));
    return out;
  }
  // A list per rank (all_gather's outputs, scatter's inputs): NCCL copies through a buffer
  // of its own, so these may be views of any layout.
  std::vector<std::vector<at::Tensor>> operator()(
      const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(lists.size());
    for (const auto& list : lists) {
      std::vector<at::Tensor> each;
      each.reserve(list.size());
      for (const at::Tensor& t : list) {
        if (nccl_ && t.defined()) nccl_rules::check_dtype(t);
        each.push_back(taken(t));
      }
      out.push_back(std::move(each));
    }
    return out;
  }
  std::shared_ptr<Pairs> pairs() const { return pairs_; }

 private:
  at::Tensor taken(const at::Tensor& t) {
    if (!t.defined() || !t.is_cuda()) return t;
    check_.check(t.device());
    if (!views_) return t;
    at::Tensor view = cpu_view(t);
    pairs_->emplace_back(view, t);
    return view;
  }

  GpuCheck& check_;
  const bool views_;
  const bool nccl_;
  std::shared_ptr<Pairs> pairs_ = std::make_shared<Pairs>();
};

class ViewWork final : public collectives::ForwardingWork {
 public:
  ViewWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<const Pairs> pairs)
      : ForwardingWork(inner, inner->retrieveOpType()), pairs_(std::move(pairs)) {}

  std::vector<at::Tensor> result() override { return originals(inner().result(), *pairs_); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto pairs = pairs_;
    return inner().getFuture()->then(
        [pairs](c10::ivalue::Future& done) -> c10::IValue {
          const c10::IValue& value = done.value();
          if (!value.isTensorList()) return value;
          return originals(value.toTensorVector(), *pairs);
        },
        c10::ListType::ofTensors());
  }

 private:
  std::shared_ptr<const Pairs> pairs_;
};

// A "nccl" group's operation as torch's profiler sees ProcessGroupNCCL's: an async event named
// "nccl:<op>" with the input tensors' shapes, from its start to its end (its wait, or its
// future's completion).
class ProfiledWork final : public collectives::ForwardingWork {
 public:
  // The event, started before the operation runs.
  class Event {
   public:
    Event(const char* title, const std::vector<at::Tensor>& inputs) {
      auto record = std::make_shared<at::RecordFunction>(at::RecordScope::USER_SCOPE);
      if (!record->isActive()) return;
      record->_setAsync();
      std::vector<c10::IValue> values;
      if (record->needsInputs()) {
        for (const at::Tensor& t : inputs) values.emplace_back(t);
      }
      record->before(title, c10::ArrayRef<const c10::IValue>(values.data(), values.size()));
      end_ = at::wrapPropagateTLSState([record] { record->end(); });
    }
    void end() {
      std::function<void()> end;
      {
        std::lock_guard lock(*mutex_);
        end.swap(end_);
      }
      if (end) end();
    }
    // When the operation started, as NCCL's watchdog counts a work's time.
    std::chrono::steady_clock::time_point started() const { return started_; }

   private:
    std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
    std::function<void()> end_;
  };

  ProfiledWork(c10::intrusive_ptr<c10d::Work> inner, Event event)
      : ForwardingWork(inner, inner->retrieveOpType()),
        event_(std::make_shared<Event>(std::move(event))) {
    if (this->inner().isCompleted()) event_->end();
  }
  ~ProfiledWork() override { event_->end(); }

  // A collective that times out says so in NCCL's watchdog's words, which code written for
  // NCCL matches ("caught collective operation timeout"), with sgpu's verdict after them.
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      const bool done = inner().wait(timeout);
      event_->end();
      return done;
    } catch (const c10::DistBackendError& e) {
      event_->end();
      const std::string what = e.what_without_backtrace();
      if (what.find(" timed out in ") == std::string::npos) throw;
      const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - event_->started());
      C10_THROW_ERROR(DistBackendError,
                      "Watchdog caught collective operation timeout: WorkNCCL(OpType=" +
                          c10d::opTypeToString(retrieveOpType()) + ") ran for " +
                          std::to_string(ran.count()) + " milliseconds before timing out (" + what +
                          ")");
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    c10::intrusive_ptr<c10::ivalue::Future> future = inner().getFuture();
    future->addCallback([event = event_](c10::ivalue::Future&) { event->end(); });
    return future;
  }

 private:
  std::shared_ptr<Event> event_;
};

// NCCL sends to and receives from the rank itself (a batch_isend_irecv with every rank as a
// peer); the transports take only other ranks, so a "nccl" group hands such a tensor over
// itself: a send is kept until its recv (by tag), or fills the recv that came first.
class SelfMail {
 public:
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int tag) {
    std::unique_lock lock(mutex_);
    auto& waiting = waiting_[tag];
    if (waiting.empty()) {
      sent_[tag].push_back(tensors[0].clone());
      return collectives::completed_work(c10::IValue(tensors));
    }
    auto [into, future] = std::move(waiting.front());
    waiting.pop_front();
    lock.unlock();
    into.copy_(tensors[0]);
    future->markCompleted(c10::IValue(std::vector<at::Tensor>{into}));
    return collectives::completed_work(c10::IValue(tensors));
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int tag) {
    std::unique_lock lock(mutex_);
    auto& sent = sent_[tag];
    if (!sent.empty()) {
      const at::Tensor from = std::move(sent.front());
      sent.pop_front();
      lock.unlock();
      tensors[0].copy_(from);
      return collectives::completed_work(c10::IValue(tensors));
    }
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    waiting_[tag].emplace_back(tensors[0], future);
    return c10d::Work::create_from_future(future);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::deque<at::Tensor>> sent_;
  std::map<int, std::deque<std::pair<at::Tensor, c10::intrusive_ptr<c10::ivalue::Future>>>>
      waiting_;
};

class CudaGroup final : public c10d::Backend {
 public:
  CudaGroup(c10::intrusive_ptr<c10d::Backend> inner, c10::intrusive_ptr<c10d::Store> store,
            bool views, bool nccl, const Meeting& meeting)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        check_(std::move(store), meeting.rank, meeting.size),
        views_(views),
        nccl_(nccl) {}

  const std::string getBackendName() const override { return inner_->getBackendName(); }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return on_views("nccl:broadcast", tensors, [&](Taken& take) {
      auto v = take(tensors);
      return inner_->broadcast(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (nccl_) nccl_rules::check_op(opts.reduceOp, tensors);
    if (nccl_ && nccl_rules::needs_stand_ins(opts.reduceOp, tensors)) {
      return nccl_rules::in_place(tensors, opts, true, [this](auto& wide, const auto& sum) {
        return allreduce(wide, sum);
      });
    }
    return on_views("nccl:all_reduce", tensors, [&](Taken& take) {
      auto v = take(tensors);
      return inner_->allreduce(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    if (nccl_) nccl_rules::check_op(opts.reduceOp, tensors);
    if (nccl_ && nccl_rules::needs_stand_ins(opts.reduceOp, tensors)) {
      return nccl_rules::in_place(tensors, opts, true, [this](auto& wide, const auto& sum) {
        return allreduce_coalesced(wide, sum);
      });
    }
    return on_views("nccl:allreduce_coalesced", tensors, [&](Taken& take) {
      auto v = take(tensors);
      return inner_->allreduce_coalesced(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    if (nccl_) nccl_rules::check_op(opts.reduceOp, tensors);
    if (nccl_ && nccl_rules::needs_stand_ins(opts.reduceOp, tensors)) {
      return nccl_rules::in_place(
          tensors, opts, getRank() == opts.rootRank,
          [this](auto& wide, const auto& sum) { return reduce(wide, sum); });
    }
    return on_views("nccl:reduce", tensors, [&](Taken& take) {
      auto v = take(tensors);
      return inner_->reduce(v, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return on_views("nccl:all_gather", inputs, [&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->allgather(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return on_views("nccl:_allgather_base", {input}, [&](Taken& take) {
      auto out = take(output);
      auto in = take(input);
      return inner_->_allgather_base(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return on_views("nccl:all_gather_coalesced", inputs, [&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->allgather_coalesced(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return on_views("nccl:allgather_into_tensor_coalesced", inputs, [&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->allgather_into_tensor_coalesced(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    if (nccl_) nccl_rules::check_op(opts.reduceOp, outputs);
    if (nccl_ && nccl_rules::needs_stand_ins(opts.reduceOp, outputs)) {
      std::vector<std::vector<at::Tensor>> wide_in;
      for (const auto& list : inputs) {
        wide_in.push_back(nccl_rules::stand_ins(list, opts.reduceOp, true));
      }
      auto wide_out = nccl_rules::stand_ins(outputs, opts.reduceOp, false);
      c10d::ReduceScatterOptions sum = opts;
      sum.reduceOp = nccl_rules::on_stand_ins(opts.reduceOp);
      return nccl_rules::rounded_into(reduce_scatter(wide_out, wide_in, sum), outputs, wide_out);
    }
    return on_views("nccl:reduce_scatter", outputs, [&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->reduce_scatter(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    if (nccl_) nccl_rules::check_op(opts.reduceOp, {input});
    if (nccl_ && nccl_rules::needs_stand_ins(opts.reduceOp, {input})) {
      at::Tensor wide_in = nccl_rules::stand_in(input, opts.reduceOp, true);
      std::vector<at::Tensor> outputs{output};
      std::vector<at::Tensor> wide_out{nccl_rules::stand_in(output, opts.reduceOp, false)};
      c10d::ReduceScatterOptions sum = opts;
      sum.reduceOp = nccl_rules::on_stand_ins(opts.reduceOp);
      return nccl_rules::rounded_into(_reduce_scatter_base(wide_out[0], wide_in, sum), outputs,
                                      wide_out);
    }
    return on_views("nccl:_reduce_scatter_base", {input}, [&](Taken& take) {
      auto out = take(output);
      auto in = take(input);
      return inner_->_reduce_scatter_base(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    if (nccl_) nccl_rules::check_op(opts.reduceOp, inputs);
    if (nccl_ && nccl_rules::needs_stand_ins(opts.reduceOp, inputs)) {
      auto wide_in = nccl_rules::stand_ins(inputs, opts.reduceOp, true);
      auto wide_out = nccl_rules::stand_ins(outputs, opts.reduceOp, false);
      c10d::ReduceScatterOptions sum = opts;
      sum.reduceOp = nccl_rules::on_stand_ins(opts.reduceOp);
      return nccl_rules::rounded_into(reduce_scatter_tensor_coalesced(wide_out, wide_in, sum),
                                      outputs, wide_out);
    }
    return on_views("nccl:reduce_scatter_tensor_coalesced", inputs, [&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->reduce_scatter_tensor_coalesced(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    return on_views("nccl:all_to_all", {input}, [&](Taken& take) {
      auto out = take(output);
      auto in = take(input);
      return inner_->alltoall_base(out, in, output_splits, input_splits, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    return on_views("nccl:all_to_all", inputs, [&](Taken& take) {
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
    return on_views("nccl:gather", inputs, [&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->gather(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return on_views("nccl:scatter", outputs, [&](Taken& take) {
      auto out = take(outputs);
      auto in = take(inputs);
      return inner_->scatter(out, in, opts);
    });
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    if (nccl_ && dst == getRank() && tensors.size() == 1) return self_mail_->send(tensors, tag);
    return on_views("nccl:send", tensors, [&](Taken& take) {
      auto v = take(tensors);
      return inner_->send(v, dst, tag);
    });
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    if (nccl_ && src == getRank() && tensors.size() == 1) return self_mail_->recv(tensors, tag);
    return on_views("nccl:recv", tensors, [&](Taken& take) {
      auto v = take(tensors);
      return inner_->recv(v, src, tag);
    });
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return on_views("nccl:recv", tensors, [&](Taken& take) {
      auto v = take(tensors);
      return inner_->recvAnysource(v, tag);
    });
  }

 private:
  // `run` on the tensors as the transport takes them; a "nccl" group's operation is an
  // event named `title` for torch's profiler, with `inputs`' shapes, as ProcessGroupNCCL's.
  template <typename Run>
  c10::intrusive_ptr<c10d::Work> on_views(const char* title, const std::vector<at::Tensor>& inputs,
                                          Run run) {
    std::optional<ProfiledWork::Event> event;
    if (nccl_) event.emplace(title, inputs);
    Taken taken(check_, views_, nccl_);
    c10::intrusive_ptr<c10d::Work> work = run(taken);
    if (!taken.pairs()->empty()) {
      work = c10::make_intrusive<ViewWork>(std::move(work), taken.pairs());
    }
    if (!event) return work;
    return c10::make_intrusive<ProfiledWork>(std::move(work), std::move(*event));
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  GpuCheck check_;
  const bool views_;
  const bool nccl_;
  std::shared_ptr<SelfMail> self_mail_ = std::make_shared<SelfMail>();
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> for_cuda_tensors(c10::intrusive_ptr<c10d::Backend> group,
                                                   c10::intrusive_ptr<c10d::Store> store,
                                                   bool cpu_views, bool as_nccl,
                                                   const Meeting& meeting) {
  return c10::make_intrusive<CudaGroup>(std::move(group), std::move(store), cpu_views, as_nccl,
                                        meeting);
}

}  // namespace sgpu::sim::cuda
