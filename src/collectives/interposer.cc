#include "collectives/interposer.h"

#include <c10/core/ScalarType.h>

#include <array>

namespace sgpu::collectives {
namespace {

using contract::CollectiveOp;

// What a tensor's collective moves: a dense one's bytes; a sparse one's values and indices
// (its nbytes() throws).
std::int64_t bytes_of(const at::Tensor& t) {
  if (!t.defined()) return 0;
  if (t.is_sparse()) {
    return static_cast<std::int64_t>(t._values().nbytes() + t._indices().nbytes());
  }
  return static_cast<std::int64_t>(t.nbytes());
}

void add(OpCall& call, const at::Tensor& t, std::int64_t& numel) {
  if (call.dtype.empty() && t.defined()) {
    call.dtype = dtype_name(t.scalar_type());
    call.host = t.device().is_cpu();
    call.data = holds_data(t);
  }
  if (t.defined()) numel += t.numel();
}

void add_inputs(OpCall& call, const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    add(call, t, call.numel_in);
    call.bytes += bytes_of(t);
  }
}

void add_outputs(OpCall& call, const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    add(call, t, call.numel_out);
    call.bytes_out += bytes_of(t);
  }
}

void add_inputs(OpCall& call, const std::vector<std::vector<at::Tensor>>& lists) {
  for (const auto& list : lists) add_inputs(call, list);
}

void add_outputs(OpCall& call, const std::vector<std::vector<at::Tensor>>& lists) {
  for (const auto& list : lists) add_outputs(call, list);
}

OpCall described(CollectiveOp op, const std::vector<at::Tensor>& in,
                 const std::vector<at::Tensor>& out) {
  OpCall call;
  call.op = op;
  add_inputs(call, in);
  add_outputs(call, out);
  return call;
}

// A barrier names a device by its options, or none: then it is the host's, as torch's
// barrier() makes its tensor on the CPU for a group that is not NCCL alone.
OpCall barrier_call(const c10d::BarrierOptions& opts) {
  OpCall call;
  call.op = CollectiveOp::kBarrier;
  call.host = opts.device ? opts.device->is_cpu() : opts.device_ids.empty();
  return call;
}

}  // namespace

// Looked up once per dtype.
const std::string& dtype_name(at::ScalarType type) {
  constexpr std::size_t kTypes = static_cast<std::size_t>(at::ScalarType::NumOptions);
  static const std::array<std::string, kTypes> names = [] {
    std::array<std::string, kTypes> all;
    for (std::size_t i = 0; i < kTypes; ++i) {
      try {
        all[i] = c10::getDtypeNames(static_cast<at::ScalarType>(i)).first;
      } catch (...) {
        all[i] = c10::toString(static_cast<at::ScalarType>(i));
      }
      if (all[i].empty()) all[i] = c10::toString(static_cast<at::ScalarType>(i));
    }
    return all;
  }();
  const auto index = static_cast<std::size_t>(type);
  static const std::string unknown = "unknown";
  return index < kTypes ? names[index] : unknown;
}

bool holds_data(const at::Tensor& t) {
  return !(t.has_storage() && t.storage().device_type() == c10::DeviceType::Meta);
}

c10::intrusive_ptr<c10d::Work> completed_work(c10::IValue value) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(value.type());
  future->markCompleted(std::move(value));
  return c10d::Work::create_from_future(future);
}

std::string reduce_op_name(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "sum";
    case c10d::ReduceOp::AVG:
      return "avg";
    case c10d::ReduceOp::PRODUCT:
      return "product";
    case c10d::ReduceOp::MIN:
      return "min";
    case c10d::ReduceOp::MAX:
      return "max";
    case c10d::ReduceOp::BAND:
      return "band";
    case c10d::ReduceOp::BOR:
      return "bor";
    case c10d::ReduceOp::BXOR:
      return "bxor";
    case c10d::ReduceOp::PREMUL_SUM:
      return "premul_sum";
    case c10d::ReduceOp::UNUSED:
      break;
  }
  return "unknown";
}

InterposingBackend::InterposingBackend(c10::intrusive_ptr<c10d::Backend> inner)
    : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

c10d::Backend& InterposingBackend::target(const OpCall& /*call*/) { return *inner_; }

c10::intrusive_ptr<c10d::Work> InterposingBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  OpCall call = described(CollectiveOp::kBroadcast, tensors, tensors);
  call.peer = static_cast<int>(opts.rootRank);
  return around(call, [&] { return target(call).broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  OpCall call = described(CollectiveOp::kAllReduce, tensors, tensors);
  call.reduce_op = reduce_op_name(opts.reduceOp);
  return around(call, [&] { return target(call).allreduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  OpCall call = described(CollectiveOp::kAllReduceCoalesced, tensors, tensors);
  call.reduce_op = reduce_op_name(opts.reduceOp);
  return around(call, [&] { return target(call).allreduce_coalesced(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  OpCall call = described(CollectiveOp::kReduce, tensors, tensors);
  call.reduce_op = reduce_op_name(opts.reduceOp);
  call.peer = static_cast<int>(opts.rootRank);
  return around(call, [&] { return target(call).reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  OpCall call = described(CollectiveOp::kAllGather, inputs, {});
  add_outputs(call, outputs);
  return around(call, [&] { return target(call).allgather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const OpCall call = described(CollectiveOp::kAllGatherIntoTensor, {input}, {output});
  return around(call, [&] { return target(call)._allgather_base(output, input, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  OpCall call = described(CollectiveOp::kAllGatherCoalesced, inputs, {});
  add_outputs(call, outputs);
  return around(call, [&] { return target(call).allgather_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const OpCall call = described(CollectiveOp::kAllGatherIntoTensorCoalesced, inputs, outputs);
  return around(
      call, [&] { return target(call).allgather_into_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  OpCall call = described(CollectiveOp::kReduceScatter, {}, outputs);
  add_inputs(call, inputs);
  call.reduce_op = reduce_op_name(opts.reduceOp);
  return around(call, [&] { return target(call).reduce_scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  OpCall call = described(CollectiveOp::kReduceScatterTensor, {input}, {output});
  call.reduce_op = reduce_op_name(opts.reduceOp);
  return around(call, [&] { return target(call)._reduce_scatter_base(output, input, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  OpCall call = described(CollectiveOp::kReduceScatterTensorCoalesced, inputs, outputs);
  call.reduce_op = reduce_op_name(opts.reduceOp);
  return around(
      call, [&] { return target(call).reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  const OpCall call = described(CollectiveOp::kAllToAllSingle, {input}, {output});
  return around(call, [&] {
    return target(call).alltoall_base(output, input, output_splits, input_splits, opts);
  });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  const OpCall call = described(CollectiveOp::kAllToAll, inputs, outputs);
  return around(call, [&] { return target(call).alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::barrier(const c10d::BarrierOptions& opts) {
  const OpCall call = barrier_call(opts);
  return around(call, [&] { return target(call).barrier(opts); });
}

// Blocking, as c10d's: the wrappers see a barrier whose Work is done when the inner call
// returns (or that throws what it threw).
void InterposingBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const OpCall call = barrier_call(opts);
  around(call, [&] {
    target(call).monitoredBarrier(opts, wait_all_ranks);
    return completed_work(c10::IValue());
  })->wait();
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  OpCall call = described(CollectiveOp::kGather, inputs, {});
  add_outputs(call, outputs);
  call.peer = static_cast<int>(opts.rootRank);
  return around(call, [&] { return target(call).gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  OpCall call = described(CollectiveOp::kScatter, {}, outputs);
  add_inputs(call, inputs);
  call.peer = static_cast<int>(opts.rootRank);
  return around(call, [&] { return target(call).scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                        int tag) {
  OpCall call = described(CollectiveOp::kSend, tensors, {});
  call.peer = dst;
  return around(call, [&] { return target(call).send(tensors, dst, tag); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                        int tag) {
  OpCall call = described(CollectiveOp::kRecv, {}, tensors);
  call.peer = src;
  return around(call, [&] { return target(call).recv(tensors, src, tag); });
}

c10::intrusive_ptr<c10d::Work> InterposingBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                 int tag) {
  const OpCall call = described(CollectiveOp::kRecvAnySource, {}, tensors);
  return around(call, [&] { return target(call).recvAnysource(tensors, tag); });
}

}  // namespace sgpu::collectives
