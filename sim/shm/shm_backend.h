// The shared-memory transport of the simulated backend: a c10d backend whose collectives
// and send/recv run through one shared-memory segment per group (sim/shm/segment.h).
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "sim/shm/segment.h"

namespace sgpu::sim::shm {

// Collective, in every rank of the group at once (it creates and joins the segment).
c10::intrusive_ptr<c10d::Backend> make_shm_backend(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                   int world, std::chrono::milliseconds timeout,
                                                   SegmentSizes sizes = {});

// "collective mismatch: the ranks of the group called different collectives: rank 0 X;
// ranks 1,2 Y": what each group of ranks called, the ranks in order. The error every rank
// of a group raises alike when its ranks call different collectives.
std::string collective_mismatch(
    const std::vector<std::pair<std::string, std::vector<int>>>& called);

// SGPU_SIM_SHM_SLOT_BYTES (a size per rank and buffer, e.g. 64KiB), else the default.
SegmentSizes sizes_from_environment();

}  // namespace sgpu::sim::shm
