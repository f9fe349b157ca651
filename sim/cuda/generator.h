// NOTE [A simulated GPU's generator]
// A CUDA generator is Philox: its state is a seed and an offset (torch.cuda.get_rng_state()
// is those 16 bytes), and what a random operator draws is a function of the two alone, so
// a program may set the offset to draw a given part of a stream. DTensor does: its random
// operators set each shard's offset before drawing and the next offset after.
//
// A simulated GPU's generator keeps the same state, and its numbers come from the CPU's
// Mersenne Twister seeded with a mix of the seed and the offset: each random operator on
// the device draws from the engine of the current (seed, offset), then moves the offset
// on by 4 (DeviceDraws in redirect.cc). So a state read and set again draws the same
// numbers, a seed set again the same sequence, and a DTensor's shards draw distinct,
// reproducible streams. What it does not reproduce is Philox's numbers: a shard's values
// are not the slice of the whole tensor's that a GPU would draw.
#pragma once

#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>

namespace sgpu::sim::cuda {

class DeviceGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit DeviceGenerator(std::uint64_t seed);

  void set_current_seed(std::uint64_t seed) override;
  std::uint64_t current_seed() const override;
  void set_offset(std::uint64_t offset) override;
  std::uint64_t get_offset() const override;
  // 16 bytes, CUDA's layout: the seed, then the offset.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  // Throws CUDA's error for a state of another size (a CPU generator's, say).
  void set_state(const c10::TensorImpl& state) override;

  // A random operator drew from the engine: the next one draws at the next offset.
  void advance();

 private:
  DeviceGenerator* clone_impl() const override;
  void reseed();  // the engine of (seed_, offset_)

  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

}  // namespace sgpu::sim::cuda
