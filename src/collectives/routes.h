// The rank's group for host and device tensors alike, when its transport takes device
// tensors only (NCCL): what torch's "cpu:gloo,cuda:nccl" is, behind one backend, so that
// a group made with "sgpu" also serves what needs a CPU path (dcp.async_save's staging,
// object collectives, a CPU tensor's all-reduce).
#pragma once

#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace sgpu::collectives {

// An operation on CPU tensors runs on `host`, any other on `device`. A barrier runs on
// `device` when its options name a device (device_ids, or a device other than the CPU),
// else on `host`, as torch's barrier() picks the CPU for a group with a CPU backend. Its
// name is `device`'s; a timeout set is set on both.
c10::intrusive_ptr<c10d::Backend> routed_by_device(c10::intrusive_ptr<c10d::Backend> device,
                                                   c10::intrusive_ptr<c10d::Backend> host);

// torch's Gloo group for `store`'s ranks, with `timeout`: a simulated transport, and the
// host path beside NCCL.
c10::intrusive_ptr<c10d::Backend> gloo_group(c10::intrusive_ptr<c10d::Store> store, int rank,
                                             int world_size, std::chrono::milliseconds timeout);

}  // namespace sgpu::collectives
