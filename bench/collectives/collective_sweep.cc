#include "collectives/collective_sweep.h"

#include <ATen/ATen.h>

#include <chrono>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace sgpu::bench {
namespace {

// Inputs are small integers, exact in bfloat16 even summed over 64 ranks: element i of
// rank q holds ((q + i) mod 4) + 1.
at::Tensor pattern(int rank, std::int64_t begin, std::int64_t end) {
  return at::arange(begin, end, at::kLong).add_(rank).remainder_(4).add_(1).to(at::kFloat);
}

// The buffers of one size, on the rank's device.
struct Buffers {
  at::Tensor input;
  at::Tensor output;  // undefined for the in-place operations
};

Buffers make_buffers(Collective op, const MessageSize& size, int rank, int world,
                     const at::TensorOptions& options) {
  const std::int64_t chunk = size.count / world;
  switch (op) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      return {pattern(rank, 0, size.count).to(options), {}};
    case Collective::kAllGather:
      return {pattern(rank, 0, chunk).to(options), at::zeros({size.count}, options)};
    case Collective::kReduceScatter:
      return {pattern(rank, 0, size.count).to(options), at::zeros({chunk}, options)};
    case Collective::kAllToAll:
      return {pattern(rank, 0, size.count).to(options), at::zeros({size.count}, options)};
    case Collective::kBarrier:
      return {};
  }
  return {};
}

// What this rank's result must hold after one operation, as float32 on the CPU.
at::Tensor expected(Collective op, const MessageSize& size, int rank, int world) {
  const std::int64_t chunk = size.count / world;
  std::vector<at::Tensor> parts;
  at::Tensor sum;
  switch (op) {
    case Collective::kAllReduce:
      sum = at::zeros({size.count}, at::kFloat);
      for (int q = 0; q < world; ++q) sum.add_(pattern(q, 0, size.count));
      return sum;
    case Collective::kBroadcast:
      return pattern(0, 0, size.count);
    case Collective::kAllGather:
      for (int q = 0; q < world; ++q) parts.push_back(pattern(q, 0, chunk));
      return at::cat(parts);
    case Collective::kReduceScatter:
      sum = at::zeros({chunk}, at::kFloat);
      for (int q = 0; q < world; ++q) sum.add_(pattern(q, rank * chunk, (rank + 1) * chunk));
      return sum;
    case Collective::kAllToAll:
      for (int q = 0; q < world; ++q) parts.push_back(pattern(q, rank * chunk, (rank + 1) * chunk));
      return at::cat(parts);
    case Collective::kBarrier:
      return {};
  }
  return {};
}

// Issues one operation; returns its work handle (already waited for on the CPU for
// Gloo, queued on the device's stream for NCCL).
c10::intrusive_ptr<c10d::Work> issue(c10d::Backend& group, Collective op, Buffers& buffers) {
  std::vector<at::Tensor> tensors{buffers.input};
  std::vector<std::int64_t> equal_splits;
  switch (op) {
    case Collective::kAllReduce:
      return group.allreduce(tensors);
    case Collective::kBroadcast: {
      c10d::BroadcastOptions options;
      options.rootRank = 0;
      return group.broadcast(tensors, options);
    }
    case Collective::kAllGather:
      return group._allgather_base(buffers.output, buffers.input);
    case Collective::kReduceScatter:
      return group._reduce_scatter_base(buffers.output, buffers.input);
    case Collective::kAllToAll:
      return group.alltoall_base(buffers.output, buffers.input, equal_splits, equal_splits);
    case Collective::kBarrier:
      return group.barrier();
  }
  return {};
}

const at::Tensor& result_of(Collective op, const Buffers& buffers) {
  return buffers.output.defined() ? buffers.output : buffers.input;
}

// Returns once the device has finished the work queued on the current stream that
// produces `tensor` (work->wait() made that stream wait for the collective's).
void wait_for_device(const at::Tensor& tensor) {
  if (tensor.defined() && tensor.is_cuda() && tensor.numel() > 0) {
    (void)tensor.reshape(-1)[0].item();
  }
}

SizeTiming run_size(c10d::Backend& group, const SweepSpec& spec, const MessageSize& size,
                    const at::TensorOptions& options) {
  const int rank = group.getRank();
  const int world = group.getSize();
  Buffers buffers = make_buffers(spec.op, size, rank, world, options);
  SizeTiming timing;
  timing.bytes = size.bytes;

  issue(group, spec.op, buffers)->wait();
  if (spec.op != Collective::kBarrier) {
    const at::Tensor got = result_of(spec.op, buffers).to(at::kCPU).to(at::kFloat);
    timing.wrong = got.ne(expected(spec.op, size, rank, world)).sum().item<std::int64_t>();
  }
  for (int i = 0; i < spec.warmup; ++i) issue(group, spec.op, buffers)->wait();
  wait_for_device(result_of(spec.op, buffers));
  group.barrier()->wait();

  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < spec.iters; ++i) issue(group, spec.op, buffers)->wait();
  wait_for_device(result_of(spec.op, buffers));
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  timing.seconds_per_op = elapsed.count() / spec.iters;
  return timing;
}

}  // namespace

std::string_view name(Collective op) {
  switch (op) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kAllGather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reducescatter";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllToAll:
      return "alltoall";
    case Collective::kBarrier:
      return "barrier";
  }
  return "?";
}

std::optional<Collective> parse_collective(std::string_view text) {
  for (Collective op : kAllCollectives) {
    if (name(op) == text) return op;
  }
  return std::nullopt;
}

std::string_view dtype_name(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::BFloat16 ? "bfloat16" : "float32";
}

std::optional<c10::ScalarType> parse_dtype(std::string_view text) {
  if (text == "float32") return c10::ScalarType::Float;
  if (text == "bfloat16") return c10::ScalarType::BFloat16;
  return std::nullopt;
}

sgpu::model::Collective model_collective(Collective op) {
  switch (op) {
    case Collective::kAllGather:
      return sgpu::model::Collective::kAllGather;
    case Collective::kReduceScatter:
      return sgpu::model::Collective::kReduceScatter;
    case Collective::kBroadcast:
      return sgpu::model::Collective::kBroadcast;
    case Collective::kAllToAll:
      return sgpu::model::Collective::kAllToAll;
    default:
      return sgpu::model::Collective::kAllReduce;
  }
}

double bus_factor(Collective op, int world_size) {
  return op == Collective::kBarrier ? 0 : sgpu::model::bus_factor(model_collective(op), world_size);
}

std::vector<MessageSize> plan_sizes(Collective op, c10::ScalarType dtype, int world_size,
                                    std::int64_t min_bytes, std::int64_t max_bytes) {
  if (op == Collective::kBarrier) return {MessageSize{}};
  const std::int64_t element = static_cast<std::int64_t>(c10::elementSize(dtype));
  const bool split = op == Collective::kAllGather || op == Collective::kReduceScatter ||
                     op == Collective::kAllToAll;
  std::vector<MessageSize> sizes;
  for (std::int64_t bytes = std::max<std::int64_t>(min_bytes, 1); bytes <= max_bytes; bytes *= 2) {
    std::int64_t count = bytes / element;
    if (split) count -= count % world_size;
    if (count == 0) continue;
    sizes.push_back({count * element, count});
  }
  return sizes;
}

SweepResult run_sweep(c10d::Backend& group, const SweepSpec& spec, const std::string& device) {
  const at::TensorOptions options = at::TensorOptions().dtype(spec.dtype).device(device);
  SweepResult result;
  for (const MessageSize& size : spec.sizes) result.push_back(run_size(group, spec, size, options));
  // No rank leaves while a peer may still wait for its part of the last operation.
  group.barrier()->wait();
  return result;
}

}  // namespace sgpu::bench
