#include "sim/cuda/generator.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace sgpu::sim::cuda {
namespace {

constexpr std::int64_t kStateBytes = 16;
constexpr std::uint64_t kStep = 4;  // Philox's offsets move in fours

// splitmix64's finaliser: nearby offsets give unrelated engines.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

DeviceGenerator::DeviceGenerator(std::uint64_t seed) : at::CPUGeneratorImpl(seed), seed_(seed) {
  reseed();
}

void DeviceGenerator::set_current_seed(std::uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
  reseed();
}

std::uint64_t DeviceGenerator::current_seed() const { return seed_; }

void DeviceGenerator::set_offset(std::uint64_t offset) {
  offset_ = offset;
  reseed();
}

std::uint64_t DeviceGenerator::get_offset() const { return offset_; }

c10::intrusive_ptr<c10::TensorImpl> DeviceGenerator::get_state() const {
  at::Tensor state = at::empty({kStateBytes}, at::TensorOptions().dtype(at::kByte));
  auto* bytes = state.data_ptr<std::uint8_t>();
  std::memcpy(bytes, &seed_, sizeof seed_);
  std::memcpy(bytes + sizeof seed_, &offset_, sizeof offset_);
  return state.getIntrusivePtr();
}

void DeviceGenerator::set_state(const c10::TensorImpl& state) {
  at::detail::check_rng_state(state);
  TORCH_CHECK(state.numel() == kStateBytes, "RNG state is wrong size");
  const auto* bytes = static_cast<const std::uint8_t*>(state.data());
  std::memcpy(&seed_, bytes, sizeof seed_);
  std::memcpy(&offset_, bytes + sizeof seed_, sizeof offset_);
  reseed();
}

void DeviceGenerator::advance() {
  offset_ += kStep;
  reseed();
}

DeviceGenerator* DeviceGenerator::clone_impl() const {
  auto* copy = new DeviceGenerator(seed_);
  copy->offset_ = offset_;
  copy->reseed();
  return copy;
}

void DeviceGenerator::reseed() {
  set_engine(at::mt19937(mix(seed_ ^ mix(offset_))));
  set_next_float_normal_sample(std::nullopt);
  set_next_double_normal_sample(std::nullopt);
}

}  // namespace sgpu::sim::cuda
