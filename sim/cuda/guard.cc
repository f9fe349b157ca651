// torch's device guard for CUDA on sim (NOTE [CUDA on sim]): what torch's device-generic
// code (the autograd engine, c10::DeviceGuard, torch.Stream and torch.Event, futures)
// asks of a device type. Work is done when it is issued, so a stream is only a name: every
// wait returns at once, and an event's time is the wall clock's when it was recorded; on
// the step's timeline (NOTE [The step's timeline]) streams and events order the
// predicted work as a GPU's would.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>

#include "collectives/timeline.h"
#include "sim/cuda/parts.h"

namespace sgpu::sim::cuda {
namespace {

constexpr int kMaxDevices = 64;

int g_count = 0;
// Each thread's current device and, per device, its current stream (CUDA keeps both per
// host thread; a new thread starts on device 0 and the default stream).
thread_local c10::DeviceIndex t_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> t_stream{};
std::atomic<c10::StreamId> g_next_stream{1};  // 0 is every device's default stream

struct Event {
  std::chrono::steady_clock::time_point recorded;
  bool was_recorded = false;
  model::Moment point;  // its stream's point on the step timeline when it was recorded
};

class Guard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    if (device.index() != old.index()) setDevice(device);
    return old;
  }
  c10::Device getDevice() const override { return {c10::DeviceType::CUDA, t_device}; }
  void setDevice(c10::Device device) const override {
    check_ordinal(device.index());
    t_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < g_count) t_device = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    check_ordinal(device.index());
    return c10::Stream(c10::Stream::UNSAFE, device, t_stream[device.index()]);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*high_priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, g_next_stream++);
  }
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return getStreamFromGlobalPool(device, false);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::Stream old = getStream(stream.device());
    t_stream[stream.device_index()] = stream.id();
    return old;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    check_ordinal(stream.device_index());
    if (*event == nullptr) *event = new Event;
    auto* e = static_cast<Event*>(*event);
    e->recorded = std::chrono::steady_clock::now();
    e->was_recorded = true;
    e->point = collectives::stream_point(stream);
  }
  // No wait on the CPU (the work was done when it was issued); on the step timeline the
  // stream goes on after the event's point (NOTE [The step's timeline]).
  void block(void* event, const c10::Stream& stream) const override {
    const auto* e = static_cast<const Event*>(event);
    if (e != nullptr && e->was_recorded) collectives::stream_waits(stream, e->point);
  }
  bool queryEvent(void*) const override { return true; }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_count);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    const auto* a = static_cast<const Event*>(start);
    const auto* b = static_cast<const Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->was_recorded && b->was_recorded,
                "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(b->recorded - a->recorded).count();
  }
};

}  // namespace

void check_ordinal(c10::DeviceIndex index) {
  if (index >= 0 && index < g_count) return;
  // CUDA's cudaErrorInvalidDevice, as torch raises it (torch.AcceleratorError).
  constexpr int32_t kInvalidDevice = 101;
  throw c10::AcceleratorError(
      {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, kInvalidDevice,
      "CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough "
      "GPUs? (cuda:" +
          std::to_string(index) + " on a simulated node of " + std::to_string(g_count) + " GPUs)");
}

void install_guard(int count, int current) {
  TORCH_CHECK(count <= kMaxDevices, "CUDA on sim serves at most ", kMaxDevices,
              " GPUs a node; this node has ", count, " (set SGPU_SIM_CUDA=off)");
  g_count = count;
  static Guard guard;
  // Replaces the CUDA library's guard in torch's registry (the registrar only stores it).
  c10::impl::DeviceGuardImplRegistrar(c10::DeviceType::CUDA, &guard);
  t_device = static_cast<c10::DeviceIndex>(current);
  // The step timeline's streams are this thread's (NOTE [The step's timeline]).
  collectives::read_current_stream_from(+[] {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, t_device),
                       t_stream[t_device]);
  });
}

c10::DeviceIndex current_device() { return t_device; }

}  // namespace sgpu::sim::cuda
