#include "collectives/timeline.h"

#include <atomic>
#include <mutex>

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

double timeline_exposed_seconds() {
  RankTimeline& t = rank_timeline();
  std::lock_guard lock(t.mutex);
  return t.timeline.exposed();
}

}  // namespace sgpu::collectives
