// The simulated device's allocator: libtorch's CPU allocator in a simulated rank, so the
// rank's tensors (the device's, as `sgpu::device()` is "cpu" on sim) count against the
// device's capacity through the caching allocator's model (NOTE [Simulated device
// memory]). Host memory is not counted: what a thread allocates inside sgpu::HostMemory,
// what a forked child (a data-loader worker) allocates, and what does not come from
// libtorch's allocator at all (the shared-memory transport's segments, sgpu's own
// records). Past the capacity an allocation throws c10::OutOfMemoryError with CUDA's
// text and the simulated device's figures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "sim/memory/caching_model.h"

namespace sgpu::sim::memory {

// Makes the counting allocator libtorch's CPU allocator for simulated GPU `device_index`
// of `capacity` bytes. Once per process; a second call throws std::logic_error.
void install_device_allocator(int device_index, std::uint64_t capacity);

// The device's statistics; std::nullopt when no counting allocator is installed.
std::optional<DeviceStats> device_stats();

// Every peak figure starts again from its current value; nothing when none is installed.
void reset_peak_stats();

// CUDA's message for an allocation that failed on GPU `device`.
std::string out_of_memory_message(int device, const OutOfMemory& failure);

// A size as torch's allocator prints it: "512 bytes", "1.50 KiB", "20.00 MiB", "79.11 GiB".
std::string format_size(std::uint64_t bytes);

}  // namespace sgpu::sim::memory
