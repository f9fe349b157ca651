// The part of a backend that makes the rank's c10d process group: NCCL on "cuda", Gloo
// (with the fault plan's collective faults) on "sim". Kept apart from backend.h because
// it needs libtorch's c10d headers, which nothing else of the interface does.
//
// make() runs in the rank, once per rank (sgpu::process_group()), with the call's store
// and timeout. It returns a ready group or throws.
#pragma once

#include <chrono>
#include <functional>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "backend/backend.h"

namespace sgpu::backend {

// Wraps a transport's group (the collective recorder: collectives/recorder.h).
using RecordHook =
    std::function<c10::intrusive_ptr<c10d::Backend>(c10::intrusive_ptr<c10d::Backend>)>;

struct ProcessGroupRequest {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int world_size = 1;
  // The group's global ranks, in its order; empty: every rank of the world, in order.
  std::vector<int> members;
  int device_index = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Applied by the factory to the transport's group, beneath anything that stands for the
  // rank's own code (the fault plan's collective faults), so what it sees is what reached
  // the transport. Empty: nothing is recorded.
  RecordHook record;
  // The group stands for NCCL's (torch's "nccl" in a Python rank): a backend that serves it
  // with another transport refuses what NCCL refuses, and runs what NCCL runs where it can.
  bool as_nccl = false;
  // In a process on a simulated node that sgpu did not start, forming its world (a group of
  // every rank): its rank there, the one a fault plan names; -1 otherwise.
  int node_world_rank = -1;
};

class ProcessGroupFactory {
 public:
  virtual ~ProcessGroupFactory() = default;
  virtual c10::intrusive_ptr<c10d::Backend> make(const ProcessGroupRequest& request) const = 0;
};

}  // namespace sgpu::backend
