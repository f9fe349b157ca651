// The part of a backend that serves torch's cuda devices from elsewhere (sim: from the CPU,
// NOTE [CUDA on sim] in sim/cuda/sim_cuda.h): what the Python package's torch.cuda calls ask
// of the served devices beyond the Backend interface. Kept apart from backend.h because it
// needs libtorch's core, which nothing else of the interface does; the native module reaches
// the simulated GPUs only through it.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "backend/backend.h"

namespace sgpu::backend {

class ServedCuda {
 public:
  virtual ~ServedCuda() = default;

  // How a refusal of what cannot run on a served GPU is thrown (the Python module's raises
  // sgpu.errors.NotSimulatedError).
  using Refusal = void (*)(const std::string& message);
  virtual void set_refusal(Refusal refusal) const = 0;
  // A node description as the backend reads it; ConfigError naming the bad part.
  virtual void check_node(const std::string& spec) const = 0;
  // The node this process's environment puts it on (sim: SGPU_SIM, else 8xH100).
  virtual std::string node() const = 0;
  // Before a fork server forks ranks that serve cuda: what they share, prepared once.
  virtual void cover_operators_ahead() const = 0;
  // In a child forked from a process that served cuda: its devices' memory counts anew.
  virtual void count_in_forked_child() const = 0;

  // Each on served device `device`, as torch.cuda's memory functions ask: what it may still
  // reserve (every process on the node counted; nullopt where memory is not counted), its
  // cache emptied, its accumulated figures reset, the fraction of it the process may take.
  virtual std::optional<std::uint64_t> free_memory(int device) const = 0;
  virtual void empty_cache(int device) const = 0;
  virtual void reset_accumulated_memory_stats(int device) const = 0;
  virtual void set_memory_fraction(int device, double fraction) const = 0;
  // `bytes` counted on served device `device` with no memory behind them (a fake tensor's
  // storage), until the returned pointer goes.
  virtual c10::DataPtr count_without_data(int device, std::size_t bytes) const = 0;
  // The served device whose memory `storage` is; -1 for host memory.
  virtual int device_of(const c10::Storage& storage) const = 0;
};

}  // namespace sgpu::backend
