// The shared-memory transport of the simulated backend: a c10d backend whose collectives
// and send/recv run through one shared-memory segment per group (sim/shm/segment.h).
#pragma once

#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "sim/shm/segment.h"

namespace sgpu::sim::shm {

// Collective, in every rank of the group at once (it creates and joins the segment).
c10::intrusive_ptr<c10d::Backend> make_shm_backend(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                   int world, std::chrono::milliseconds timeout,
                                                   SegmentSizes sizes = {});

// SGPU_SIM_SHM_SLOT_BYTES (a size per rank and buffer, e.g. 64KiB), else the default.
SegmentSizes sizes_from_environment();

}  // namespace sgpu::sim::shm
