// The simulated devices' allocator: libtorch's CPU allocator in a simulated rank, counting
// what the rank allocates against its devices' capacities through the caching allocator's
// model (NOTE [Simulated device memory]). Past a capacity an allocation throws
// c10::OutOfMemoryError with CUDA's text and the simulated device's figures.
//
// It counts in one of two ways:
// - every CPU allocation, on the rank's device (`sgpu::device()` is "cpu" on sim): what a
//   C++ rank and a Python rank with SGPU_SIM_CUDA=off see. Host memory is not counted:
//   what a thread allocates inside sgpu::HostMemory, what a forked child (a data-loader
//   worker) allocates, and what does not come from libtorch's allocator at all (the
//   shared-memory transport's segments, sgpu's own records);
// - only what is allocated inside a DeviceScope, on the scope's device: with CUDA on sim
//   (NOTE [CUDA on sim]), where a tensor on cuda:N is device memory and one on the CPU is
//   host memory, as on a GPU node. Every device of the node has its own model.
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/memory/caching_model.h"

namespace sgpu::contract {
class NodeMemory;
}

namespace sgpu::sim::memory {

// Makes the counting allocator libtorch's CPU allocator for simulated GPU `device_index`
// of `capacity` bytes, counting every CPU allocation there. Once per process; a second
// call throws std::logic_error.
void install_device_allocator(int device_index, std::uint64_t capacity);

// From now on only allocations inside a DeviceScope count, each on its scope's device;
// `capacities` holds every device of the node by index. Installs the counting allocator
// when install_device_allocator() did not (the rank's device is then `device_index`);
// once installed, what was counted on the rank's device stays counted until freed.
void count_in_device_scopes(int device_index, const std::vector<std::uint64_t>& capacities);

// From now on each device's segments come from its GPU's capacity in the node's `ledger` too
// (NOTE [A node's shared device memory] in src/contract/node_memory.h), `node_indices[i]`
// being device i's index on the node (before CUDA_VISIBLE_DEVICES renumbered them). Nothing
// for a null ledger, or a device with no model.
void share_node_memory(contract::NodeMemory* ledger, const std::vector<int>& node_indices);

// What device `device` may still reserve: its capacity less its segments, and no more than
// what no process on the node holds where its capacity is shared; std::nullopt as below.
std::optional<std::uint64_t> free_memory(int device);

// In a forked child, which counts nothing (a data-loader worker): its allocations count
// again, as a process's that starts using the devices, for a child of a process that had not
// used them (on a GPU node: had not initialised CUDA) before it forked.
void count_in_forked_child();

// Whether allocations count only inside DeviceScopes (count_in_device_scopes() was called).
bool counts_in_device_scopes();

// While alive, what this thread allocates through libtorch's CPU allocator is memory of
// simulated GPU `device` (when counting in device scopes). Nests; -1 means host memory.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_;
};

// A c10 allocator whose every allocation is memory of simulated GPU `device` (the storage
// of a cuda tensor on sim grows through it, and is known as the device's by it). Lives as
// long as the process; works uncounted when no counting allocator is installed.
c10::Allocator* cuda_device_allocator(int device);

// The device `allocator` is cuda_device_allocator() of; -1 for any other allocator.
int cuda_device_of(const c10::Allocator* allocator);

// Memory of simulated GPU `device` that holds no data: a fake tensor's storage (shape-only
// compute), counted by the device's model as an allocation of `bytes` is (rounding,
// segments, peaks; CUDA's out-of-memory error past the capacity) and freed when the
// returned DataPtr goes. Nothing is counted (an empty DataPtr) when the device has no
// model.
c10::DataPtr count_without_data(int device, std::size_t bytes);

// A device's statistics: `device` -1 is the rank's own. std::nullopt when no counting
// allocator is installed, or the device has none.
std::optional<DeviceStats> device_stats(int device = -1);

// Every peak figure starts again from its current value; nothing when none is installed.
void reset_peak_stats(int device = -1);

// Every accumulated figure (".allocated", ".freed", the counts of retries and OOMs) starts
// again from zero, as torch.cuda.reset_accumulated_memory_stats() does.
void reset_accumulated_stats(int device = -1);

// Releases the device's cached segments that are wholly free (torch.cuda.empty_cache()).
void empty_cache(int device = -1);

// The device's capacity: `fraction` of what the node spec gives it, as
// torch.cuda.set_per_process_memory_fraction() limits what the caching allocator may take.
void set_memory_fraction(int device, double fraction);

// The device's capacity now, and the bytes its segments hold; std::nullopt as above.
std::optional<std::uint64_t> capacity(int device = -1);

// CUDA's message for an allocation that failed on GPU `device`.
std::string out_of_memory_message(int device, const OutOfMemory& failure);

// A size as torch's allocator prints it: "512 bytes", "1.50 KiB", "20.00 MiB", "79.11 GiB".
std::string format_size(std::uint64_t bytes);

}  // namespace sgpu::sim::memory
