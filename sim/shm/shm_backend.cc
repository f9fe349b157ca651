// NOTE [The shared-memory transport]
// Every rank of a group maps one segment (segment.h). A collective runs in stages; in a
// stage each rank writes its part into its own slot of one of the two buffers, all ranks
// meet at a round (a counting barrier in the segment), and each reads what it needs from
// the slots. Stages alternate buffers: a rank reads stage S's buffer only before it
// arrives at the first round of stage S+1, so stage S+2 may overwrite it.
// - all-reduce and reduce: small stages are folded by every rank (reduce: the root)
//   straight from the slots, in rank order; large ones by portions, each rank folding
//   its 1/N of the stage into rank 0's slot, then a second round, then everyone copies.
//   Either way element i is ((x0 op x1) op x2) ..., as one process folding in rank order.
// - broadcast, all-gather, gather, scatter, reduce-scatter and all-to-all move each
//   rank's pieces through its slot; data larger than a slot takes more stages.
// - In each op's first stage every rank also writes a descriptor (sequence number, op,
//   dtype, count, root, reduce op; all-to-all: the lengths it sends and expects); after
//   the round every rank compares all of them, so a mismatch fails every rank alike,
//   naming the ranks that differ.
// - send/recv go through a ring per ordered pair, moved on by whichever wait the rank is
//   in (its own p2p wait or a collective's round), so isend/irecv pairs never deadlock.
// Waiting: a short spin when every rank has a core, then up to 64 sched_yield()s (on 8
// ranks and 2 cores this lets the rank being waited for run at once: a small all-reduce
// took about 60 us going straight to the futex, 15-30 us yielding, as Open MPI's does),
// then a futex on the rank's doorbell, which whoever changes what it waits for rings. A
// sleeping rank wakes every 50 ms to see whether a rank it waits for has exited (pidfds)
// or its deadline (the group's timeout) has passed, and says which ranks had not arrived.
// Collectives complete before the call returns (the Work is already done, or failed: then
// the group is broken); bad arguments throw from the call, as Gloo's do. Send and recv
// complete when waited on or found complete.
#include "sim/shm/shm_backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>

#include "contract/collective_ring.h"
#include "contract/option_table.h"
#include "sim/cuda/sim_cuda.h"
#include "sim/shm/reduce.h"

namespace sgpu::sim::shm {
namespace {

using Op = c10d::ReduceOp::RedOpType;

using contract::CollectiveOp;
using contract::op_name;

std::string describe(const Descriptor& d) {
  std::ostringstream out;
  out << op_name(static_cast<CollectiveOp>(d.op)) << " #" << d.seq;
  if (static_cast<CollectiveOp>(d.op) == CollectiveOp::kBarrier) return out.str();
  if (static_cast<CollectiveOp>(d.op) != CollectiveOp::kAllToAll) {
    out << " of " << d.count << ' ' << c10::toString(static_cast<c10::ScalarType>(d.dtype));
  }
  if (d.reduce >= 0) out << " (" << reduce_op_name(static_cast<Op>(d.reduce)) << ')';
  if (d.root >= 0) out << " from root " << d.root;
  return out.str();
}

bool same_op(const Descriptor& a, const Descriptor& b) {
  return a.seq == b.seq && a.op == b.op && a.dtype == b.dtype && a.count == b.count &&
         a.root == b.root && a.reduce == b.reduce;
}

// A CPU tensor the transport can address as bytes: the tensor itself when dense and
// contiguous, else a contiguous copy that finish() writes back.
struct Dense {
  at::Tensor original;
  at::Tensor work;
  explicit Dense(const at::Tensor& t, std::string_view what) : original(t) {
    // A cuda tensor's memory is host memory where cuda is served (NOTE [CUDA on sim]).
    TORCH_CHECK(t.device().is_cpu() || (t.is_cuda() && cuda::served()),
                "sgpu's simulated process group takes CPU tensors; ", what, " got one on ",
                t.device(), " (sgpu::device() is \"cpu\" in a C++ rank on sim)");
    TORCH_CHECK(t.layout() == c10::kStrided, "sgpu's simulated process group takes dense tensors; ",
                what, " got a ", t.layout(), " one");
    work = t.is_contiguous() ? t : t.contiguous();
  }
  std::byte* data() const { return static_cast<std::byte*>(work.data_ptr()); }
  std::size_t bytes() const { return work.nbytes(); }
  void finish() {
    if (!work.is_same(original)) original.copy_(work);
  }
};

// memcpy for pieces that may be empty, whose pointers may then be null (an empty tensor's).
void copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

const c10::TypePtr& tensor_list_type() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return type;
}

// A collective's Work: done when made; its future holds the outputs or the error.
class DoneWork final : public c10d::Work {
 public:
  DoneWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::exception_ptr error,
           std::uint64_t seq)
      : c10d::Work(rank, type), outputs_(std::move(outputs)), seq_(seq) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list_type());
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::uint64_t seq_;
};

constexpr std::size_t kMessageHeader = 16;  // tag, bytes
constexpr int kAnySource = -1;              // a receive's peer until a sender matches it

struct P2P {
  bool send = true;
  int peer = 0;
  std::uint64_t tag = 0;
  at::Tensor tensor;  // kept alive while in flight
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::size_t moved = 0;
  bool header = false;
  bool done = false;
  std::exception_ptr error;
};

class ShmBackend;

class P2PWork final : public c10d::Work {
 public:
  P2PWork(c10::intrusive_ptr<ShmBackend> group, std::shared_ptr<P2P> op, int rank,
          c10d::OpType type);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override { return op_->peer; }
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return {op_->tensor}; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  c10::intrusive_ptr<ShmBackend> group_;
  std::shared_ptr<P2P> op_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ShmBackend final : public c10d::Backend {
 public:
  ShmBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int world,
             std::chrono::milliseconds timeout, SegmentSizes sizes)
      : c10d::Backend(rank, world), timeout_(timeout) {
    segment_ = Segment::join(*store, "sgpu/shm/segment", rank, world, sizes, timeout);
    sends_.resize(world);
    recvs_.resize(world);
  }

  const std::string getBackendName() const override { return "sgpu_shm"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return run(c10d::OpType::ALLREDUCE, tensors, [&] {
      TORCH_CHECK(tensors.size() == 1, "all_reduce takes one tensor, not ", tensors.size());
      check_reducible(tensors[0].scalar_type(), opts.reduceOp.op_);
      Dense t(tensors[0], "all_reduce");
      reduce_into(CollectiveOp::kAllReduce, t, opts.reduceOp.op_, -1);
      t.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return run(c10d::OpType::ALLREDUCE_COALESCED, tensors, [&] {
      for (at::Tensor& tensor : tensors) {
        check_reducible(tensor.scalar_type(), opts.reduceOp.op_);
        Dense t(tensor, "all_reduce_coalesced");
        reduce_into(CollectiveOp::kAllReduce, t, opts.reduceOp.op_, -1);
        t.finish();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    return run(c10d::OpType::REDUCE, tensors, [&] {
      TORCH_CHECK(tensors.size() == 1, "reduce takes one tensor, not ", tensors.size());
      check_root(opts.rootRank);
      check_reducible(tensors[0].scalar_type(), opts.reduceOp.op_);
      Dense t(tensors[0], "reduce");
      reduce_into(CollectiveOp::kReduce, t, opts.reduceOp.op_, static_cast<int>(opts.rootRank));
      t.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return run(c10d::OpType::BROADCAST, tensors, [&] {
      TORCH_CHECK(tensors.size() == 1, "broadcast takes one tensor, not ", tensors.size());
      check_root(opts.rootRank);
      const int root = static_cast<int>(opts.rootRank);
      Dense t(tensors[0], "broadcast");
      const std::size_t e = t.work.element_size();
      const std::size_t n = t.work.numel();
      const std::size_t cap = std::max<std::size_t>(1, segment_->slot_bytes() / e);
      Descriptor d = descriptor(CollectiveOp::kBroadcast, t.work, n, root, -1);
      std::size_t off = 0;
      do {
        const std::size_t c = std::min(cap, n - off);
        const int b = begin_stage();
        if (rank_ == root) copy_bytes(segment_->slot(b, root), t.data() + off * e, c * e);
        sync(d, b, off == 0);
        if (rank_ != root) copy_bytes(t.data() + off * e, segment_->slot(b, root), c * e);
        off += c;
      } while (off < n);
      t.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    std::vector<at::Tensor> flat;
    if (outputs.size() == 1) flat = outputs[0];
    return run(c10d::OpType::ALLGATHER, flat, [&] {
      TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
                  "all_gather takes one input tensor and one list of outputs");
      TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_,
                  "all_gather needs one output tensor per rank (", size_, "), got ",
                  outputs[0].size());
      gather_into(CollectiveOp::kAllGather, inputs[0], outputs[0], -1);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    std::vector<at::Tensor> outs{output};
    return run(c10d::OpType::_ALLGATHER_BASE, outs, [&] {
      TORCH_CHECK(output.numel() == input.numel() * size_, "all_gather_into_tensor: the output (",
                  output.numel(), " elements) must hold world size (", size_, ") x the input (",
                  input.numel(), ")");
      TORCH_CHECK(output.scalar_type() == input.scalar_type(),
                  "all_gather_into_tensor: output and input dtypes differ");
      Dense out(output, "all_gather_into_tensor");
      std::vector<at::Tensor> pieces = out.work.view({-1}).chunk(size_);
      if (input.numel() == 0) pieces.assign(size_, out.work.view({-1}));
      gather_into(CollectiveOp::kAllGather, input, pieces, -1);
      out.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override {
    std::vector<at::Tensor> flat;
    for (auto& list : outputs) flat.insert(flat.end(), list.begin(), list.end());
    return run(c10d::OpType::ALLGATHER_COALESCED, flat, [&] {
      // c10d's layout: outputs[rank][input], one list a rank, each as long as the inputs.
      TORCH_CHECK(static_cast<int>(outputs.size()) == size_,
                  "allgather_coalesced: ", outputs.size(), " output lists for a world of ", size_,
                  " (one a rank)");
      for (const auto& list : outputs) {
        TORCH_CHECK(list.size() == inputs.size(), "allgather_coalesced: an output list of ",
                    list.size(), " tensors for ", inputs.size(), " inputs");
      }
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        std::vector<at::Tensor> pieces;
        pieces.reserve(outputs.size());
        for (auto& list : outputs) pieces.push_back(list[i]);
        gather_into(CollectiveOp::kAllGather, inputs[i], pieces, -1);
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return run(c10d::OpType::COALESCED, outputs, [&] {
      TORCH_CHECK(outputs.size() == inputs.size(),
                  "all_gather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
                  inputs.size(), " inputs");
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        _allgather_base(outputs[i], inputs[i], opts)->wait();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    std::vector<at::Tensor> flat;
    if (outputs.size() == 1) flat = outputs[0];
    return run(c10d::OpType::GATHER, flat, [&] {
      check_root(opts.rootRank);
      const int root = static_cast<int>(opts.rootRank);
      TORCH_CHECK(inputs.size() == 1, "gather takes one input tensor");
      std::vector<at::Tensor> none;
      if (rank_ == root) {
        TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                    "gather: the root needs one output tensor per rank (", size_, ")");
      }
      gather_into(CollectiveOp::kGather, inputs[0], rank_ == root ? outputs[0] : none, root);
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return run(c10d::OpType::SCATTER, outputs, [&] {
      check_root(opts.rootRank);
      const int root = static_cast<int>(opts.rootRank);
      TORCH_CHECK(outputs.size() == 1, "scatter takes one output tensor");
      std::vector<at::Tensor> pieces;
      if (rank_ == root) {
        TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                    "scatter: the root needs one input tensor per rank (", size_, ")");
        pieces = inputs[0];
      }
      scatter_from(CollectiveOp::kScatter, pieces, outputs[0], -1, root);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return run(c10d::OpType::REDUCE_SCATTER, outputs, [&] {
      TORCH_CHECK(
          outputs.size() == 1 && inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
          "reduce_scatter takes one output and one list of world size (", size_, ") inputs");
      check_reducible(outputs[0].scalar_type(), opts.reduceOp.op_);
      scatter_from(CollectiveOp::kReduceScatter, inputs[0], outputs[0], opts.reduceOp.op_, -1);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> outs{output};
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, outs, [&] {
      TORCH_CHECK(input.numel() == output.numel() * size_, "reduce_scatter_tensor: the input (",
                  input.numel(), " elements) must hold world size (", size_, ") x the output (",
                  output.numel(), ")");
      TORCH_CHECK(output.scalar_type() == input.scalar_type(),
                  "reduce_scatter_tensor: output and input dtypes differ");
      check_reducible(output.scalar_type(), opts.reduceOp.op_);
      const at::Tensor flat = input.contiguous().view({-1});
      std::vector<at::Tensor> pieces =
          output.numel() == 0 ? std::vector<at::Tensor>(size_, flat) : flat.chunk(size_);
      scatter_from(CollectiveOp::kReduceScatter, pieces, output, opts.reduceOp.op_, -1);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return run(c10d::OpType::COALESCED, outputs, [&] {
      TORCH_CHECK(outputs.size() == inputs.size(),
                  "reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
                  inputs.size(), " inputs");
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        _reduce_scatter_base(outputs[i], inputs[i], opts)->wait();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    std::vector<at::Tensor> outs{output};
    return run(c10d::OpType::ALLTOALL_BASE, outs, [&] {
      TORCH_CHECK(output.scalar_type() == input.scalar_type(),
                  "all_to_all_single: output and input dtypes differ");
      Dense in(input, "all_to_all_single");
      Dense out(output, "all_to_all_single");
      std::vector<Piece> sends = split_rows(in, input_splits, "input");
      std::vector<Piece> receives = split_rows(out, output_splits, "output");
      exchange(sends, receives, in.work.scalar_type());
      out.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    return run(c10d::OpType::ALLTOALL, outputs, [&] {
      TORCH_CHECK(
          static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
          "all_to_all takes one input and one output tensor per rank (", size_, ")");
      std::vector<Dense> ins, outs;
      std::vector<Piece> sends, receives;
      for (int r = 0; r < size_; ++r) {
        ins.emplace_back(inputs[r], "all_to_all");
        outs.emplace_back(outputs[r], "all_to_all");
        TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                        outputs[r].scalar_type() == inputs[0].scalar_type(),
                    "all_to_all: the tensors' dtypes differ");
      }
      for (int r = 0; r < size_; ++r) {
        sends.push_back({ins[r].data(), ins[r].bytes()});
        receives.push_back({outs[r].data(), outs[r].bytes()});
      }
      exchange(sends, receives, inputs.empty() ? c10::kByte : inputs[0].scalar_type());
      for (Dense& o : outs) o.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    std::vector<at::Tensor> none;
    return run(c10d::OpType::BARRIER, none, [&] {
      Descriptor d{};
      d.seq = seq_;
      d.op = static_cast<std::uint32_t>(CollectiveOp::kBarrier);
      const int b = begin_stage();
      sync(d, b, true);
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return point_to_point(tensors, dst, tag, /*send=*/true);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return point_to_point(tensors, src, tag, /*send=*/false);
  }

  // From whichever rank first sends a message of this tag; the Work's sourceRank() says who.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return point_to_point(tensors, kAnySource, tag, /*send=*/false);
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) override {
    // A barrier under its own timeout, which names every rank that never arrived; a timeout
    // opens with Gloo's words ("Rank 0 timed out in monitoredBarrier after 1000 ms."), which
    // programs and torch's own tests look for.
    std::lock_guard lock(mutex_);
    const std::chrono::milliseconds saved = timeout_;
    if (opts.timeout != c10d::kUnsetTimeout) timeout_ = opts.timeout;
    const std::chrono::milliseconds limit = timeout_;
    try {
      barrier(opts)->wait();
    } catch (const c10::DistBackendError& error) {
      timeout_ = saved;
      const std::string verdict = error.what_without_backtrace();
      if (verdict.find(" timed out in ") == std::string::npos) throw;
      C10_THROW_ERROR(DistBackendError, "Rank " + std::to_string(rank_) +
                                            " timed out in monitoredBarrier after " +
                                            std::to_string(limit.count()) + " ms. " + verdict);
    } catch (...) {
      timeout_ = saved;
      throw;
    }
    timeout_ = saved;
  }

  // The p2p side, for P2PWork.
  bool p2p_done(const P2P& op) {
    std::lock_guard lock(mutex_);
    progress();
    return op.done;
  }

  bool p2p_wait(const std::shared_ptr<P2P>& op, std::chrono::milliseconds timeout) {
    std::lock_guard lock(mutex_);
    progress();
    if (op->done) return true;
    const std::chrono::milliseconds limit =
        timeout == std::chrono::milliseconds(0) ? timeout_ : std::min(timeout, timeout_);
    const auto what = [&] {
      std::ostringstream out;
      out << (op->send ? "send to rank " : "recv from rank ") << op->peer << " (tag " << op->tag
          << ", " << op->bytes << " bytes; " << op->moved << " moved) after " << limit.count()
          << " ms";
      return out.str();
    };
    try {
      segment_->wait_until([&] { return op->done; }, Clock::now() + limit, op->peer, what,
                           [&] { progress(); });
    } catch (const std::exception& e) {
      // The rings may now be mid-message: nothing more goes through this group.
      if (broken_.empty()) broken_ = e.what();
      fail_p2p(std::current_exception());
    }
    return true;
  }

 private:
  struct Piece {
    std::byte* data;
    std::size_t bytes;
  };

  template <class Body>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, std::vector<at::Tensor> outputs,
                                     Body&& body) {
    std::lock_guard lock(mutex_);  // recursive: the coalesced ops run the plain ones
    std::exception_ptr error;
    const std::uint32_t rounds_before = round_;
    const std::uint64_t seq_before = seq_;
    try {
      TORCH_CHECK(broken_.empty(),
                  "this process group failed earlier and cannot be used: ", broken_);
      ++seq_;
      segment_->state(rank_).seq.store(seq_, std::memory_order_relaxed);
      deadline_ = Clock::now() + timeout_;
      body();
    } catch (const std::exception& e) {
      if (round_ == rounds_before) {
        // Refused before any rank was involved (bad arguments, as Gloo refuses them): the
        // call throws and the group stays as it was.
        seq_ = seq_before;
        segment_->state(rank_).seq.store(seq_, std::memory_order_relaxed);
        throw;
      }
      // Failed with the other ranks (a timeout, a peer gone, a mismatch): the ranks may
      // no longer agree on where they are, so the group takes nothing more.
      if (broken_.empty()) broken_ = e.what();
      error = std::current_exception();
    }
    return c10::make_intrusive<DoneWork>(rank_, type, std::move(outputs), error, seq_);
  }

  void check_root(int64_t root) const {
    TORCH_CHECK(root >= 0 && root < size_, "root rank ", root, " is outside the group (size ",
                size_, ")");
  }

  Descriptor descriptor(CollectiveOp kind, const at::Tensor& t, std::size_t count, int root,
                        int reduce) const {
    Descriptor d;
    d.seq = seq_;
    d.op = static_cast<std::uint32_t>(kind);
    d.dtype = static_cast<std::int32_t>(t.scalar_type());
    d.count = count;
    d.root = root;
    d.reduce = reduce;
    return d;
  }

  int begin_stage() { return static_cast<int>(stage_++ & 1U); }

  // One round. In an op's first stage the descriptors go with it and are compared.
  void sync(const Descriptor& d, int buffer, bool first) {
    if (first) segment_->state(rank_).descriptor[buffer] = d;
    meet(d);
    if (first) compare(buffer);
  }

  // The next round, with every rank.
  void meet(const Descriptor& d) {
    ++round_;
    segment_->arrive(
        round_, deadline_, [&] { return what(d); }, [&] { progress(); });
  }

  // AVG: the sum divided by the world size (integers truncated).
  void average(at::Tensor& t) const {
    if (c10::isIntegralType(t.scalar_type(), false)) {
      t.div_(size_, "trunc");
    } else {
      t.div_(size_);
    }
  }

  std::string what(const Descriptor& d) const {
    std::ostringstream out;
    out << describe(d) << " (rank " << rank_ << " of " << size_ << ", timeout " << timeout_.count()
        << " ms)";
    return out.str();
  }

  void compare(int buffer) const {
    const Descriptor& first = segment_->state(0).descriptor[buffer];
    bool same = true;
    for (int r = 1; r < size_ && same; ++r) {
      same = same_op(first, segment_->state(r).descriptor[buffer]);
    }
    if (same) return;
    // Group the ranks by what they called.
    std::vector<std::pair<Descriptor, std::vector<int>>> groups;
    for (int r = 0; r < size_; ++r) {
      const Descriptor& d = segment_->state(r).descriptor[buffer];
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return same_op(g.first, d); });
      if (it == groups.end()) {
        groups.push_back({d, {r}});
      } else {
        it->second.push_back(r);
      }
    }
    std::vector<std::pair<std::string, std::vector<int>>> called;
    for (const auto& [d, ranks] : groups) called.emplace_back(describe(d), ranks);
    C10_THROW_ERROR(DistBackendError, collective_mismatch(called));
  }

  // All-reduce (root -1) and reduce into t, in place.
  void reduce_into(CollectiveOp kind, Dense& t, Op op, int root) {
    const std::size_t e = t.work.element_size();
    const std::size_t n = t.work.numel();
    const c10::ScalarType dtype = t.work.scalar_type();
    const std::size_t cap = std::max<std::size_t>(1, segment_->slot_bytes() / e);
    const Descriptor d = descriptor(kind, t.work, n, root, static_cast<int>(op));
    std::size_t off = 0;
    do {
      const std::size_t c = std::min(cap, n - off);
      const int b = begin_stage();
      copy_bytes(segment_->slot(b, rank_), t.data() + off * e, c * e);
      sync(d, b, off == 0);
      std::byte* out = t.data() + off * e;
      if (c * e * size_ <= kFoldWhole || size_ == 1) {
        if (root < 0 || rank_ == root) {
          copy_bytes(out, segment_->slot(b, 0), c * e);
          for (int r = 1; r < size_; ++r) combine(out, segment_->slot(b, r), c, dtype, op);
        }
      } else {
        const std::size_t lo = c * rank_ / size_;
        const std::size_t hi = c * (rank_ + 1) / size_;
        std::byte* acc = segment_->slot(b, 0) + lo * e;
        for (int r = 1; r < size_; ++r) {
          combine(acc, segment_->slot(b, r) + lo * e, hi - lo, dtype, op);
        }
        meet(d);
        if (root < 0 || rank_ == root) copy_bytes(out, segment_->slot(b, 0), c * e);
      }
      off += c;
    } while (off < n);
    if (op == Op::AVG && (root < 0 || rank_ == root)) average(t.work);
  }

  // All-gather and gather: every rank's input into outputs[r] (root -1: on every rank).
  void gather_into(CollectiveOp kind, const at::Tensor& input,
                   const std::vector<at::Tensor>& outputs, int root) {
    Dense in(input, op_name(kind));
    std::vector<Dense> outs;
    for (const at::Tensor& o : outputs) {
      outs.emplace_back(o, op_name(kind));
      TORCH_CHECK(o.numel() == input.numel() && o.scalar_type() == input.scalar_type(),
                  op_name(kind), ": each output must be like the input (", input.numel(), ' ',
                  input.scalar_type(), "), one is ", o.numel(), ' ', o.scalar_type());
    }
    const std::size_t e = input.element_size();
    const std::size_t n = input.numel();
    const std::size_t cap = std::max<std::size_t>(1, segment_->slot_bytes() / e);
    const Descriptor d = descriptor(kind, in.work, n, root, -1);
    std::size_t off = 0;
    do {
      const std::size_t c = std::min(cap, n - off);
      const int b = begin_stage();
      copy_bytes(segment_->slot(b, rank_), in.data() + off * e, c * e);
      sync(d, b, off == 0);
      for (std::size_t r = 0; r < outs.size(); ++r) {
        copy_bytes(outs[r].data() + off * e, segment_->slot(b, static_cast<int>(r)), c * e);
      }
      off += c;
    } while (off < n);
    for (Dense& o : outs) o.finish();
  }

  // Reduce-scatter (root -1: output = fold over ranks of their inputs[rank]) and scatter
  // (reduce -1: output = the root's inputs[rank]).
  void scatter_from(CollectiveOp kind, const std::vector<at::Tensor>& inputs,
                    const at::Tensor& output, int reduce, int root) {
    Dense out(output, op_name(kind));
    std::vector<Dense> ins;
    for (const at::Tensor& i : inputs) {
      ins.emplace_back(i, op_name(kind));
      TORCH_CHECK(i.numel() == output.numel() && i.scalar_type() == output.scalar_type(),
                  op_name(kind), ": each input must be like the output (", output.numel(), ' ',
                  output.scalar_type(), "), one is ", i.numel(), ' ', i.scalar_type());
    }
    const std::size_t e = output.element_size();
    const std::size_t n = output.numel();
    const c10::ScalarType dtype = output.scalar_type();
    const std::size_t cap =
        std::max<std::size_t>(1, segment_->slot_bytes() / (e * static_cast<std::size_t>(size_)));
    const Descriptor d = descriptor(kind, out.work, n, root, reduce);
    const int source = root >= 0 ? root : rank_;
    std::size_t off = 0;
    do {
      const std::size_t c = std::min(cap, n - off);
      const int b = begin_stage();
      if (rank_ == source) {
        for (std::size_t j = 0; j < ins.size(); ++j) {
          copy_bytes(segment_->slot(b, rank_) + j * c * e, ins[j].data() + off * e, c * e);
        }
      }
      sync(d, b, off == 0);
      std::byte* dst = out.data() + off * e;
      const std::size_t mine = static_cast<std::size_t>(rank_) * c * e;
      if (root >= 0) {
        copy_bytes(dst, segment_->slot(b, root) + mine, c * e);
      } else {
        copy_bytes(dst, segment_->slot(b, 0) + mine, c * e);
        for (int r = 1; r < size_; ++r) {
          combine(dst, segment_->slot(b, r) + mine, c, dtype, static_cast<Op>(reduce));
        }
      }
      off += c;
    } while (off < n);
    if (reduce == static_cast<int>(Op::AVG)) average(out.work);
    out.finish();
  }

  // The pieces of an all-to-all tensor along dim 0: equal when splits is empty.
  std::vector<Piece> split_rows(const Dense& t, const std::vector<int64_t>& splits,
                                const char* which) const {
    const int64_t rows = t.work.dim() == 0 ? 1 : t.work.size(0);
    const std::size_t row_bytes = rows == 0 ? 0 : t.bytes() / static_cast<std::size_t>(rows);
    std::vector<int64_t> counts = splits;
    if (counts.empty()) {
      TORCH_CHECK(rows % size_ == 0, "all_to_all_single: the ", which, "'s first dimension (", rows,
                  ") does not split evenly across ", size_, " ranks; pass splits");
      counts.assign(size_, rows / size_);
    }
    TORCH_CHECK(static_cast<int>(counts.size()) == size_, "all_to_all_single: ", counts.size(), " ",
                which, " splits for ", size_, " ranks");
    int64_t total = 0;
    for (int64_t c : counts) {
      TORCH_CHECK(c >= 0, "all_to_all_single: a negative ", which, " split");
      total += c;
    }
    TORCH_CHECK(total == rows, "all_to_all_single: the ", which, " splits add up to ", total,
                ", the tensor has ", rows, " rows");
    std::vector<Piece> pieces;
    std::size_t at = 0;
    for (int64_t c : counts) {
      const std::size_t bytes = static_cast<std::size_t>(c) * row_bytes;
      pieces.push_back({t.data() + at, bytes});
      at += bytes;
    }
    return pieces;
  }

  void exchange(const std::vector<Piece>& sends, const std::vector<Piece>& receives,
                c10::ScalarType dtype) {
    const std::size_t q = std::max<std::size_t>(1, segment_->slot_bytes() / size_);
    Descriptor d{};
    d.seq = seq_;
    d.op = static_cast<std::uint32_t>(CollectiveOp::kAllToAll);
    d.dtype = static_cast<std::int32_t>(dtype);
    for (const Piece& p : sends) d.extra = std::max<std::uint64_t>(d.extra, p.bytes);
    std::size_t stages = 1;
    for (std::size_t k = 0; k < stages; ++k) {
      const int b = begin_stage();
      std::byte* mine = segment_->slot(b, rank_);
      for (int dst = 0; dst < size_; ++dst) {
        const Piece& p = sends[dst];
        const std::size_t from = std::min(p.bytes, k * q);
        copy_bytes(mine + dst * q, p.data + from, std::min(q, p.bytes - from));
      }
      if (k == 0) {
        std::uint64_t* lengths = segment_->lengths(b, rank_);
        for (int r = 0; r < size_; ++r) {
          lengths[r] = sends[r].bytes;
          lengths[size_ + r] = receives[r].bytes;
        }
      }
      sync(d, b, k == 0);
      if (k == 0) {
        std::uint64_t longest = 0;
        for (int r = 0; r < size_; ++r) {
          longest = std::max(longest, segment_->state(r).descriptor[b].extra);
        }
        stages = std::max<std::size_t>(1, (longest + q - 1) / q);
        check_lengths(b, d);
      }
      for (int src = 0; src < size_; ++src) {
        const Piece& p = receives[src];
        const std::size_t from = std::min(p.bytes, k * q);
        copy_bytes(p.data + from, segment_->slot(b, src) + rank_ * q, std::min(q, p.bytes - from));
      }
    }
  }

  // Every rank checks every pair, so all fail alike.
  void check_lengths(int buffer, const Descriptor& d) const {
    for (int s = 0; s < size_; ++s) {
      for (int r = 0; r < size_; ++r) {
        const std::uint64_t sent = segment_->lengths(buffer, s)[r];
        const std::uint64_t expected = segment_->lengths(buffer, r)[size_ + s];
        if (sent != expected) {
          std::ostringstream out;
          out << describe(d) << ": rank " << s << " sends " << sent << " bytes to rank " << r
              << ", which expects " << expected << " from it (the splits disagree)";
          C10_THROW_ERROR(DistBackendError, out.str());
        }
      }
    }
  }

  c10::intrusive_ptr<c10d::Work> point_to_point(std::vector<at::Tensor>& tensors, int peer, int tag,
                                                bool send);

  // Ends every send and recv in flight with `error`.
  void fail_p2p(std::exception_ptr error) {
    const auto fail = [&](std::deque<std::shared_ptr<P2P>>& queue) {
      for (const auto& op : queue) {
        op->error = error;
        op->done = true;
      }
      queue.clear();
    };
    for (auto* queues : {&sends_, &recvs_}) {
      for (auto& queue : *queues) fail(queue);
    }
    fail(any_recvs_);
  }

  // Moves every send and recv in flight as far as the rings allow. A receive from any
  // source takes the first sender whose next message has its tag, among those no receive
  // named already waits on (messages between two ranks are taken in order).
  void progress() {
    for (int peer = 0; peer < size_; ++peer) {
      while (!sends_[peer].empty() && push(*sends_[peer].front())) sends_[peer].pop_front();
      while (!recvs_[peer].empty() && pull(*recvs_[peer].front())) recvs_[peer].pop_front();
    }
    while (!any_recvs_.empty()) {
      const int from = sender_with(any_recvs_.front()->tag);
      if (from < 0) break;
      any_recvs_.front()->peer = from;
      recvs_[from].push_back(std::move(any_recvs_.front()));
      any_recvs_.pop_front();
      while (!recvs_[from].empty() && pull(*recvs_[from].front())) recvs_[from].pop_front();
    }
  }

  // A rank whose next message to this one, whole header there, has `tag`; -1 for none.
  int sender_with(std::uint64_t tag) const {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || !recvs_[peer].empty()) continue;
      const ChannelHeader& ch = segment_->channel(peer, rank_);
      const std::uint64_t head = ch.head.load(std::memory_order_acquire);
      const std::uint64_t tail = ch.tail.load(std::memory_order_relaxed);
      if (head - tail < kMessageHeader) continue;
      std::uint64_t header[2];
      ring_read(segment_->ring(peer, rank_), tail, reinterpret_cast<std::byte*>(header),
                kMessageHeader);
      if (header[0] == tag) return peer;
    }
    return -1;
  }

  void ring_write(std::byte* ring, std::uint64_t at, const std::byte* src, std::size_t n) const {
    const std::size_t cap = segment_->channel_bytes();
    const std::size_t pos = at % cap;
    const std::size_t first = std::min(n, cap - pos);
    copy_bytes(ring + pos, src, first);
    copy_bytes(ring, src + first, n - first);
  }

  void ring_read(const std::byte* ring, std::uint64_t at, std::byte* dst, std::size_t n) const {
    const std::size_t cap = segment_->channel_bytes();
    const std::size_t pos = at % cap;
    const std::size_t first = std::min(n, cap - pos);
    copy_bytes(dst, ring + pos, first);
    copy_bytes(dst + first, ring, n - first);
  }

  // True when op is complete.
  bool push(P2P& op) {
    ChannelHeader& ch = segment_->channel(rank_, op.peer);
    std::byte* ring = segment_->ring(rank_, op.peer);
    std::uint64_t head = ch.head.load(std::memory_order_relaxed);
    const std::uint64_t tail = ch.tail.load(std::memory_order_acquire);
    std::size_t space = segment_->channel_bytes() - static_cast<std::size_t>(head - tail);
    const std::uint64_t before = head;
    if (!op.header) {
      if (space < kMessageHeader) return false;
      const std::uint64_t header[2] = {op.tag, op.bytes};
      ring_write(ring, head, reinterpret_cast<const std::byte*>(header), kMessageHeader);
      head += kMessageHeader;
      space -= kMessageHeader;
      op.header = true;
    }
    const std::size_t n = std::min(space, op.bytes - op.moved);
    ring_write(ring, head, op.data + op.moved, n);
    head += n;
    op.moved += n;
    if (head != before) {
      ch.head.store(head, std::memory_order_release);
      segment_->ring_doorbell(op.peer);
    }
    op.done = op.moved == op.bytes;
    return op.done;
  }

  bool pull(P2P& op) {
    ChannelHeader& ch = segment_->channel(op.peer, rank_);
    const std::byte* ring = segment_->ring(op.peer, rank_);
    const std::uint64_t head = ch.head.load(std::memory_order_acquire);
    std::uint64_t tail = ch.tail.load(std::memory_order_relaxed);
    std::size_t ready = static_cast<std::size_t>(head - tail);
    const std::uint64_t before = tail;
    if (!op.header) {
      if (ready < kMessageHeader) return false;
      std::uint64_t header[2];
      ring_read(ring, tail, reinterpret_cast<std::byte*>(header), kMessageHeader);
      if (header[0] != op.tag || header[1] != op.bytes) {
        std::ostringstream out;
        out << "recv from rank " << op.peer << " expected tag " << op.tag << " of " << op.bytes
            << " bytes; the next message rank " << op.peer << " sent has tag " << header[0]
            << " and " << header[1] << " bytes (sends and recvs between two ranks must match "
            << "in order)";
        broken_ = out.str();
        try {
          C10_THROW_ERROR(DistBackendError, out.str());
        } catch (...) {
          op.error = std::current_exception();
        }
        op.done = true;
        return true;
      }
      tail += kMessageHeader;
      ready -= kMessageHeader;
      op.header = true;
    }
    const std::size_t n = std::min(ready, op.bytes - op.moved);
    ring_read(ring, tail, op.data + op.moved, n);
    tail += n;
    op.moved += n;
    if (tail != before) {
      ch.tail.store(tail, std::memory_order_release);
      segment_->ring_doorbell(op.peer);
    }
    op.done = op.moved == op.bytes;
    return op.done;
  }

  // Fold in place when all ranks' stage data together is at most this; above it, fold by
  // portions (a second round, but each rank reads only 1/N of the others' data).
  static constexpr std::size_t kFoldWhole = 32 * 1024;

  std::unique_ptr<Segment> segment_;
  std::chrono::milliseconds timeout_;
  std::recursive_mutex mutex_;
  std::uint64_t seq_ = 0;
  std::uint32_t stage_ = 0;
  std::uint32_t round_ = 0;
  Clock::time_point deadline_;
  std::string broken_;
  std::vector<std::deque<std::shared_ptr<P2P>>> sends_;
  std::vector<std::deque<std::shared_ptr<P2P>>> recvs_;
  std::deque<std::shared_ptr<P2P>> any_recvs_;  // receives from any source, not yet matched
};

c10::intrusive_ptr<c10d::Work> ShmBackend::point_to_point(std::vector<at::Tensor>& tensors,
                                                          int peer, int tag, bool send) {
  const char* what = send ? "send" : "recv";
  TORCH_CHECK(tensors.size() == 1, what, " takes one tensor, not ", tensors.size());
  TORCH_CHECK((peer >= 0 && peer < size_ && peer != rank_) || (!send && peer == kAnySource), what,
              ": rank ", peer, " is not another rank of the group (size ", size_, ")");
  TORCH_CHECK(tag >= 0, what, ": a negative tag");
  auto op = std::make_shared<P2P>();
  op->send = send;
  op->peer = peer;
  op->tag = static_cast<std::uint64_t>(tag);
  Dense t(tensors[0], what);
  TORCH_CHECK(send || t.work.is_same(t.original), "recv needs a contiguous tensor to receive into");
  op->tensor = t.work;
  op->data = t.data();
  op->bytes = t.bytes();
  {
    std::lock_guard lock(mutex_);
    TORCH_CHECK(broken_.empty(), "this process group failed earlier and cannot be used: ", broken_);
    if (peer == kAnySource) {
      any_recvs_.push_back(op);
    } else {
      (send ? sends_ : recvs_)[peer].push_back(op);
    }
    progress();
  }
  return c10::make_intrusive<P2PWork>(
      c10::intrusive_ptr<ShmBackend>::unsafe_reclaim_from_nonowning(this), op, rank_,
      send ? c10d::OpType::SEND : c10d::OpType::RECV);
}

P2PWork::P2PWork(c10::intrusive_ptr<ShmBackend> group, std::shared_ptr<P2P> op, int rank,
                 c10d::OpType type)
    : c10d::Work(rank, type), group_(std::move(group)), op_(std::move(op)) {}

bool P2PWork::isCompleted() { return group_->p2p_done(*op_); }
bool P2PWork::isSuccess() const { return op_->done && !op_->error; }
std::exception_ptr P2PWork::exception() const { return op_->error; }

bool P2PWork::wait(std::chrono::milliseconds timeout) {
  group_->p2p_wait(op_, timeout);
  if (op_->error) std::rethrow_exception(op_->error);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> P2PWork::getFuture() {
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list_type());
    wait(std::chrono::milliseconds(0));
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{op_->tensor}));
  }
  return future_;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_shm_backend(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                   int world, std::chrono::milliseconds timeout,
                                                   SegmentSizes sizes) {
  return c10::make_intrusive<ShmBackend>(std::move(store), rank, world, timeout, sizes);
}

std::string collective_mismatch(
    const std::vector<std::pair<std::string, std::vector<int>>>& called) {
  std::string text = "collective mismatch: the ranks of the group called different collectives: ";
  for (std::size_t c = 0; c < called.size(); ++c) {
    const std::vector<int>& ranks = called[c].second;
    text += (c == 0 ? "" : "; ") + std::string(ranks.size() == 1 ? "rank " : "ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i)
      text += (i == 0 ? "" : ",") + std::to_string(ranks[i]);
    text += " " + called[c].first;
  }
  return text;
}

SegmentSizes sizes_from_environment() {
  SegmentSizes sizes;
  if (const auto bytes = contract::setting_value("SGPU_SIM_SHM_SLOT_BYTES")) {
    sizes.slot_bytes = static_cast<std::size_t>(std::get<long long>(*bytes));
  }
  return sizes;
}

}  // namespace sgpu::sim::shm
