#include "collectives/timeline.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

namespace sgpu::collectives {
namespace {

struct RankTimeline {
  std::mutex mutex;
  model::StreamTimeline timeline;
};

RankTimeline& rank_timeline() {
  static auto* timeline = new RankTimeline;  // lives to the rank's end
  return *timeline;
}

std::int64_t key_of(const c10::Stream& stream) {
  return (static_cast<std::int64_t>(stream.device_index()) << 48) ^ stream.id();
}

std::atomic<CurrentStream> g_current_stream{nullptr};

std::int64_t current_stream() {
  const CurrentStream reader = g_current_stream.load();
  return reader == nullptr ? 0 : key_of(reader());
}

}  // namespace

void read_current_stream_from(CurrentStream reader) { g_current_stream.store(reader); }

double time_kernel(double host_seconds, double kernel_seconds) {
  const std::int64_t stream = current_stream();
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  return t.timeline.kernel(stream, host_seconds, kernel_seconds);
}

model::Moment time_collective(std::uintptr_t channel, double seconds) {
  const std::int64_t stream = current_stream();
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  return t.timeline.collective(static_cast<std::int64_t>(channel), stream, seconds);
}

void wait_on_current_stream(const model::Moment& point) {
  const std::int64_t stream = current_stream();
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  t.timeline.wait(stream, point);
}

model::Moment stream_point(const c10::Stream& stream) {
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  return t.timeline.now(key_of(stream));
}

void stream_waits(const c10::Stream& stream, const model::Moment& point) {
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  t.timeline.wait(key_of(stream), point);
}

namespace {

// The GPUs of `value`'s tensors on `issued_on`'s device type; `issued_on`'s where it holds
// none.
std::vector<c10::Device> devices_of(const c10::IValue& value, const c10::Stream& issued_on) {
  std::vector<c10::Device> devices;
  c10::IValue::HashAliasedIValues values;
  value.getSubValues(values);
  for (const c10::IValue& each : values) {
    if (!each.isTensor() || !each.toTensor().defined()) continue;
    const c10::Device device = each.toTensor().device();
    if (device.type() != issued_on.device_type()) continue;
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      devices.push_back(device);
    }
  }
  if (devices.empty()) devices.push_back(issued_on.device());
  return devices;
}

// `future` completed with `value`, its events at `end` on the GPUs of `value`'s tensors.
// Its events are recorded on each GPU's current stream: here a stream of the collective's
// own at its end, as NCCL records them on its stream. The tensors may be shapes only (their
// storage on no GPU), so the GPUs are named by storages of no bytes.
void complete_at(c10::ivalue::Future& future, const c10::IValue& value,
                 const c10::Stream& issued_on, const model::Moment& end) {
  const c10::impl::DeviceGuardImplInterface* guard =
      c10::impl::getDeviceGuardImpl(issued_on.device_type());
  std::vector<c10::Storage> names;
  std::vector<c10::Stream> ends;
  for (const c10::Device& device : devices_of(value, issued_on)) {
    names.emplace_back(c10::Storage::use_byte_size_t(), std::size_t{0},
                       c10::DataPtr(nullptr, device), nullptr, false);
    ends.push_back(guard->getStreamFromGlobalPool(device, false));
    stream_waits(ends.back(), end);
  }
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storages;
  storages.reserve(names.size());
  for (const c10::Storage& name : names) storages.push_back(name.getWeakStorageImpl());
  const c10::MultiStreamGuard on(ends);
  future.markCompleted(value, std::move(storages));
}

}  // namespace

c10::intrusive_ptr<c10::ivalue::Future> completes_at(c10::intrusive_ptr<c10::ivalue::Future> done,
                                                     const model::Moment& end) {
  const CurrentStream reader = g_current_stream.load();
  if (reader == nullptr) return done;
  const c10::Stream issued_on = reader();
  const c10::DeviceIndex count =
      c10::impl::getDeviceGuardImpl(issued_on.device_type())->deviceCount();
  std::vector<c10::Device> devices;
  for (c10::DeviceIndex i = 0; i < count; ++i) devices.emplace_back(issued_on.device_type(), i);
  auto future = c10::make_intrusive<c10::ivalue::Future>(done->elementType(), devices);
  done->addCallback([future, issued_on, end](c10::ivalue::Future& ran) {
    if (ran.hasError()) {
      future->setError(ran.exception_ptr());
      return;
    }
    try {
      complete_at(*future, ran.value(), issued_on, end);
    } catch (...) {  // a callback must not throw: the future holds it
      future->setErrorIfNeeded(std::current_exception());
    }
  });
  return future;
}

model::Moment timeline_ends() {
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  return {t.timeline.end(), t.timeline.compute_end()};
}

double timeline_exposed_seconds() {
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  return t.timeline.exposed();
}

}  // namespace sgpu::collectives
