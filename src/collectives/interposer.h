// A c10d backend that stands in front of another and sees every operation before it runs:
// what the fault plan (sim) and the collective recorder wrap around a transport. Each
// operation is described (op, dtype, element counts, reduce op, root or peer) and handed
// to around() with the call that runs it on the inner backend.
#pragma once

#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <utility>
#include <vector>

#include "contract/collective_ring.h"

namespace sgpu::collectives {

// What an operation is about to do.
struct OpCall {
  contract::CollectiveOp op = contract::CollectiveOp::kBarrier;
  std::string dtype;      // "float32", ...; "" without tensors
  std::string reduce_op;  // "sum", ...; "" for ops without one
  int peer = -1;          // root, or a transfer's peer (group ranks)
  std::int64_t numel_in = 0;
  std::int64_t numel_out = 0;
  std::int64_t bytes = 0;      // of the inputs
  std::int64_t bytes_out = 0;  // of the outputs
  bool host = true;  // its tensors are in host memory (the first one's device is the CPU); a
                     // barrier's, unless its options name a device (device_ids, or device)
  bool data = true;  // its tensors hold data; false for fake tensors (shapes, no storage)
};

// torch's name of a dtype ("float32", "bfloat16", "float8_e4m3fn"), as torch.float32 prints
// without its module.
const std::string& dtype_name(at::ScalarType type);

// Whether `t` holds data: false for a fake tensor (shape-only compute), whose storage is
// the meta device's whatever device the tensor names.
bool holds_data(const at::Tensor& t);

// A Work done already, its future holding `value`.
c10::intrusive_ptr<c10d::Work> completed_work(c10::IValue value);

// A Work in front of another: every question goes to the inner one; a subclass overrides
// what it adds (the recorder's end of an entry, a CUDA-on-sim group's views or profiler
// event).
class ForwardingWork : public c10d::Work {
 public:
  ForwardingWork(c10::intrusive_ptr<c10d::Work> inner, c10d::OpType type)
      : c10d::Work(-1, type), inner_(std::move(inner)) {}

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override { return inner_->wait(timeout); }
  void abort() override { inner_->abort(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }

 protected:
  c10d::Work& inner() const { return *inner_; }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
};

// "sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum".
std::string reduce_op_name(const c10d::ReduceOp& op);

class InterposingBackend : public c10d::Backend {
 public:
  explicit InterposingBackend(c10::intrusive_ptr<c10d::Backend> inner);

  const std::string getBackendName() const override { return inner_->getBackendName(); }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }

 protected:
  using Run = c10::function_ref<c10::intrusive_ptr<c10d::Work>()>;
  // Runs `run` (the operation on the inner backend) and returns its Work, doing what the
  // wrapper does around it.
  virtual c10::intrusive_ptr<c10d::Work> around(const OpCall& call, Run run) = 0;
  // The backend the operation runs on: the inner one, unless a wrapper routes it elsewhere.
  virtual c10d::Backend& target(const OpCall& call);
  c10d::Backend& inner() { return *inner_; }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace sgpu::collectives
